"""The demo and benchmark harness (private: not part of dpgate's API).

It reproduces the experiment of Xiao & Xiong, "Bayesian Inference under
Differential Privacy" (2012), §6.4 on the gateway: the online workload
(:mod:`~dpgate._demo.workload`, eq. 73–74), its metrics
(:mod:`~dpgate._demo.metrics`, definitions 6.1–6.3), running it through gateways
(:mod:`~dpgate._demo.runner`) and what ``dpgate demo`` prints and draws
(:mod:`~dpgate._demo.report`).  ``dpgate demo`` and ``benchmarks/`` use it; the
core package never imports it.  Its plot and progress bar need the ``demo``
extra (``pip install 'dpgate[demo]'``: matplotlib, tqdm), imported on use.
"""

from __future__ import annotations

from dpgate._demo._optional import MissingDependency, require
from dpgate._demo.metrics import (
    QueryRecord,
    answering_ratio,
    coverage,
    coverage_paper,
    coverage_se,
    free_share,
    relative_error,
    released_share,
    summarize,
    system_cost,
)
from dpgate._demo.runner import SYSTEMS, QueryGateway, load_histogram, noise_seed, release_tree, run, run_systems
from dpgate._demo.workload import (
    DELTA,
    MAX_TRIALS,
    SETTINGS,
    TREE_CELLS,
    Setting,
    TreeNode,
    Workload,
    WorkloadQuery,
    cell_probabilities,
    generate,
    tree_nodes,
)

__all__ = [
    "MissingDependency",
    "require",
    "Setting",
    "SETTINGS",
    "DELTA",
    "MAX_TRIALS",
    "TREE_CELLS",
    "WorkloadQuery",
    "TreeNode",
    "Workload",
    "cell_probabilities",
    "generate",
    "tree_nodes",
    "QueryRecord",
    "answering_ratio",
    "system_cost",
    "coverage",
    "coverage_paper",
    "coverage_se",
    "released_share",
    "relative_error",
    "free_share",
    "summarize",
    "QueryGateway",
    "SYSTEMS",
    "release_tree",
    "run",
    "noise_seed",
    "load_histogram",
    "run_systems",
]
