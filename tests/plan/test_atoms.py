"""Atoms: the coarsest partition on which every refined query is constant."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpgate.compile.query import LinearQuery
from dpgate.errors import UnsupportedQuery
from dpgate.plan.atoms import AtomPartition, BoxGrid
from dpgate.schema.domains import Schema

SMALL = Schema.from_dict(
    {
        "tables": {
            "t": {
                "columns": {
                    "a": {"type": "integer", "min": 0, "max": 3},  # 5 cells
                    "b": {"type": "categorical", "values": ["x", "y"]},  # 4 cells
                    "c": {"type": "boolean"},  # 3 cells
                }
            }
        }
    }
).table("t")
ALL_CELLS = np.array(list(itertools.product(*(range(c.n_cells) for c in SMALL.columns))))


def atom_of_cells(p: AtomPartition, cells: np.ndarray) -> np.ndarray:
    """Atom id of each cell; ``cells`` has shape ``(n, len(table.columns))`` of cell indices."""
    idx = [np.searchsorted(np.asarray(bp), cells[:, p.table.axis(c)], side="right") - 1
           for c, bp in zip(p.columns, p.breakpoints, strict=True)]
    if not idx:
        return np.zeros(len(cells), dtype=np.int64)
    return p.labels[tuple(idx)].astype(np.int64)


def is_constant(p: AtomPartition, query: LinearQuery) -> bool:
    """Whether ``query`` is constant on every atom of ``p`` (a full-grid check)."""
    grid = {c.lower(): set(bp) for c, bp in zip(p.columns, p.breakpoints, strict=True)}
    if any(not set(bp) <= grid.get(c.lower(), set())
           for c, bp in zip(query.columns, query.breakpoints, strict=True)):
        return False  # the query cuts a box of the partition's grid
    w = np.ascontiguousarray(query.expand(p.table, p.columns, p.breakpoints)).ravel()
    labels = p.labels.ravel()
    _, first = np.unique(labels, return_index=True)  # one box per atom
    return bool(np.array_equal(w, w[first][labels]))


@st.composite
def queries(draw: st.DrawFn) -> LinearQuery:
    names = draw(st.lists(st.sampled_from([c.name for c in SMALL.columns]), min_size=0, max_size=3, unique=True))
    bps = []
    for n in names:
        k = SMALL.column(n).n_cells
        inner = draw(st.lists(st.integers(1, k - 1), max_size=k - 1, unique=True))
        bps.append([0, *sorted(inner)])
    shape = tuple(len(b) for b in bps)
    size = int(np.prod(shape)) if shape else 1
    w = draw(st.lists(st.integers(-3, 3), min_size=size, max_size=size))
    den = draw(st.sampled_from([1, 2, 4]))
    return LinearQuery.from_grid(SMALL, names, bps, np.array(w, dtype=float).reshape(shape) / den)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), min_size=1, max_size=6))
def test_atoms_reproduce_dense_vectors_and_are_coarsest(qs: list[LinearQuery]) -> None:
    p = AtomPartition(SMALL)
    seen: list[LinearQuery] = []
    old_atoms = atom_of_cells(p, ALL_CELLS)
    for q in qs:
        parent = p.refine(q)
        seen.append(q)
        atoms = atom_of_cells(p, ALL_CELLS)
        # Parent maps: every cell's new atom came from its old atom.
        if parent is None:
            assert len(np.unique(atoms)) == len(np.unique(old_atoms))
            assert np.array_equal(atoms, old_atoms)
        else:
            assert len(parent) == p.n_atoms
            assert np.array_equal(parent[atoms], old_atoms)
            assert np.all(np.diff(parent) >= 0)
        old_atoms = atoms
        # Every query seen reproduces its dense vector, exactly.
        for s in seen:
            dense = s.dense(SMALL).ravel()
            assert np.array_equal(dense, p.vector(s)[atoms])
            assert np.array_equal(s.expand(SMALL, [c.name for c in SMALL.columns],
                                           [range(c.n_cells) for c in SMALL.columns]).ravel(),
                                  p.atom_numerators(s)[atoms])
            assert is_constant(p, s)
        # Located together (one search per column for queries over the same columns): bit for bit.
        for s, v in zip(seen, p.vectors(seen), strict=True):
            assert v.dtype == np.float64 and v.tobytes() == p.vector(s).tobytes()
        # Coarsest: atoms are exactly the classes of equal signatures.
        sig = np.stack([s.dense(SMALL).ravel() for s in seen], axis=1)
        n_classes = len(np.unique(sig, axis=0))
        assert p.n_atoms == n_classes == len(np.unique(atoms))
        # Cell sizes count domain cells.
        sizes = p.cell_sizes
        assert sizes.sum() == SMALL.n_cells
        assert np.array_equal(sizes, np.bincount(atoms, minlength=p.n_atoms).astype(float))


def test_initial_partition_is_one_atom() -> None:
    p = AtomPartition(SMALL)
    assert p.n_atoms == 1 and p.columns == () and p.cell_sizes.tolist() == [60.0]
    q = LinearQuery.from_grid(SMALL, [], [], np.array(2.0))
    assert p.refine(q) is None
    assert p.vector(q).tolist() == [2.0]


def test_repeat_and_coarser_queries_do_not_split() -> None:
    p = AtomPartition(SMALL)
    q = LinearQuery.from_grid(SMALL, ["a"], [[0, 2]], np.array([1.0, 0.0]))
    assert p.refine(q) is not None
    assert p.refine(q) is None
    # Complement: same partition.
    q2 = LinearQuery.from_grid(SMALL, ["a"], [[0, 2]], np.array([0.0, 1.0]))
    assert p.refine(q2) is None
    assert p.n_atoms == 2


def test_large_domain_stays_small() -> None:
    t = Schema.from_dict(
        {"tables": {"p": {"columns": {"income": {"type": "integer", "min": 0, "max": 500000},
                                      "age": {"type": "integer", "min": 0, "max": 100}}}}}
    ).table("p")
    rng = np.random.default_rng(0)
    p = AtomPartition(t)
    for _ in range(50):
        lo, hi = sorted(rng.choice(500001, 2, replace=False).tolist())
        a = int(rng.integers(1, 100))
        q = LinearQuery.from_grid(t, ["income", "age"], [[0, lo, hi], [0, a]], np.array([[0, 0.0], [1, 0], [0, 0]]))
        p.refine(q)
        assert is_constant(p, q)
    assert p.n_atoms <= 51 * 51
    assert p.cell_sizes.sum() == t.n_cells


def test_limits_raise_and_leave_partition_unchanged() -> None:
    p = AtomPartition(SMALL, max_atoms=3)
    q = LinearQuery.from_grid(SMALL, ["a"], [[0, 1, 2]], np.array([0.0, 1.0, 2.0]))
    p.refine(q)
    q2 = LinearQuery.from_grid(SMALL, ["b"], [[0, 1]], np.array([0.0, 1.0]))
    before = (p.columns, p.breakpoints, p.n_atoms, p.labels.copy())
    with pytest.raises(UnsupportedQuery, match=r"6 atoms .* limit of 3"):
        p.refine(q2)
    assert (p.columns, p.breakpoints, p.n_atoms) == before[:3] and np.array_equal(p.labels, before[3])

    g = AtomPartition(SMALL, max_grid=10)
    q3 = LinearQuery.from_grid(SMALL, ["a", "b"], [[0, 1, 2], [0, 1, 2, 3]], np.arange(12.0).reshape(3, 4))
    with pytest.raises(UnsupportedQuery, match=r"grid of 12 boxes .* limit of 10"):
        g.refine(q3)
    assert g.n_atoms == 1 and g.columns == ()


def test_vector_requires_refinement() -> None:
    from dpgate.errors import DPGateInternalError

    p = AtomPartition(SMALL)
    q = LinearQuery.from_grid(SMALL, ["c"], [[0, 1]], np.array([0.0, 1.0]))
    with pytest.raises(DPGateInternalError, match="refine"):
        p.vector(q)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), min_size=1, max_size=6))
def test_box_grid_reproduces_dense_vectors_and_maps_onto_the_atoms(qs: list[LinearQuery]) -> None:
    """The cost side's partition: every box of the breakpoint grid an atom; parents, vectors and
    the map onto the (coarser) inference atoms agree with the cells."""
    grid, atoms = BoxGrid(SMALL), AtomPartition(SMALL)
    old = atom_of_cells(grid, ALL_CELLS)  # type: ignore[arg-type]
    for q in qs:
        parent = grid.refine(q)
        atoms.refine(q)
        boxes = atom_of_cells(grid, ALL_CELLS)  # type: ignore[arg-type]
        if parent is None:
            assert np.array_equal(boxes, old)
        else:
            assert len(parent) == grid.n_atoms and np.array_equal(parent[boxes], old)
        old = boxes
        assert grid.n_atoms == int(np.prod([len(b) for b in grid.breakpoints]))
        np.testing.assert_array_equal(q.dense(SMALL).ravel(), grid.vector(q)[boxes])
        np.testing.assert_array_equal(grid.atom_of(atoms)[boxes], atom_of_cells(atoms, ALL_CELLS))


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), min_size=1, max_size=6), st.integers(1, 40))
def test_the_refusal_bound_never_exceeds_the_atoms_a_refinement_makes(qs: list[LinearQuery], limit: int) -> None:
    """A refinement is refused early from a lower bound on the atoms it would make; the bound
    is at most the exact count, so the limit refuses exactly what the full refinement would."""
    free, capped = AtomPartition(SMALL, max_atoms=10**6), AtomPartition(SMALL, max_atoms=limit)
    for q in qs:
        cols, bps = free._merged_grid(q)
        bound = free._atoms_at_least(q, cols, bps)
        free.refine(q)
        assert bound <= free.n_atoms
        exact = copy.copy(capped)
        exact.max_atoms = 10**6
        exact.refine(q)
        before = capped.n_atoms
        try:
            capped.refine(q)
        except UnsupportedQuery:
            assert capped.n_atoms == before and exact.n_atoms > limit  # refused only over the limit, unchanged
            continue
        assert capped.n_atoms == exact.n_atoms <= limit and is_constant(capped, q)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), min_size=1, max_size=5))
def test_boxes_by_cell_partition_the_grid_by_the_query_weights(qs: list[LinearQuery]) -> None:
    """Each cell of a query's own columns holds the boxes where the query has its weight there."""
    grid = BoxGrid(SMALL)
    for q in qs:
        grid.refine(q)
    q = qs[-1]
    nums, boxes = grid.boxes_by_cell(q)
    assert sorted(boxes.ravel().tolist()) == list(range(grid.n_atoms))
    np.testing.assert_array_equal(grid.atom_numerators(q)[boxes], np.repeat(nums[:, None], boxes.shape[1], axis=1))


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), max_size=3), st.sampled_from(["a", "b", "c"]), st.data(), st.booleans())
def test_group_vectors_from_their_joint_split_are_the_vectors(
    before: list[LinearQuery], column: str, data: st.DataObject, by_split: bool
) -> None:
    """A GROUP BY's groups, located through their joint split's codes (once it is known),
    get each query's own vector bit for bit — whether the atoms were refined by the split
    or group by group, after any history."""
    from dpgate.plan.atoms import joint_split

    p = AtomPartition(SMALL)
    for q in before:
        p.refine(q)
    n = SMALL.column(column).n_cells
    owner = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))  # cell → group (some empty)
    groups = []
    for g in sorted(set(owner)):
        w = np.array([data.draw(st.sampled_from([1, 2, -3])) if o == g else 0 for o in owner], dtype=float)
        groups.append(LinearQuery.from_grid(SMALL, [column], [list(range(n))], w / data.draw(st.sampled_from([1, 3]))))
    if len(groups) < 2:
        return
    split, run = joint_split(SMALL, groups)
    assert split is not None and run == len(groups)
    if by_split:
        p.refine(split)
    else:
        for g in groups:
            p.refine(g)
    for g, v in zip(groups, p.vectors(groups), strict=True):
        assert v.dtype == np.float64 and v.tobytes() == p.vector(g).tobytes()


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), min_size=1, max_size=5), st.integers(0, 4))
def test_nonzero_weights_are_the_dense_vectors_nonzeros(qs: list[LinearQuery], pick: int) -> None:
    """A query's charge located from its own non-zero boxes (a tree node on a fine cost grid)
    is the dense vector's non-zeros, bit for bit, in increasing box order."""
    grid = BoxGrid(SMALL)
    for q in qs:
        grid.refine(q)
    q = qs[pick % len(qs)]
    found = grid.nonzero_weights(q)
    if not q.columns:
        assert found is None
        return
    assert found is not None
    v = grid.vector(q)
    on = np.flatnonzero(v)
    boxes, weights = found
    assert boxes.dtype == np.int64 and weights.dtype == np.float64
    np.testing.assert_array_equal(boxes, on)
    assert weights.tobytes() == v[on].tobytes()


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(queries(), min_size=1, max_size=4), queries())
def test_grid_versions_are_equal_exactly_for_equal_grids(qs: list[LinearQuery], extra: LinearQuery) -> None:
    """A cost grid's version (a memo key, its hash computed once) is equal for grids refined
    alike — separately built, copied or pickled — and differs once the breakpoints do."""
    import pickle

    one, two = BoxGrid(SMALL), BoxGrid(SMALL)
    for q in qs:
        one.refine(q)
        two.refine(q)
    assert one.version == two.version and hash(one.version) == hash(two.version)
    assert pickle.loads(pickle.dumps(one)).version == one.version
    same = one.version
    moved = copy.copy(one)
    moved.refine(extra)
    assert one.version is same  # the original is untouched
    assert (moved.version == same) == (moved.breakpoints == one.breakpoints)
