"""Stage "record": the durable, append-only, keyed record of every release.

- :mod:`~dpgate.ledger.core` — :class:`Ledger`: opening, binding, appending, reading;
- :mod:`~dpgate.ledger._records` — the record format and its keyed chain
  (:mod:`~dpgate.ledger._key` holds the key, MACs and anchor);
- :mod:`~dpgate.ledger._store` — the storage interface a ledger holds (records and provenance);
  :mod:`~dpgate.ledger._sqlite`, :mod:`~dpgate.ledger._postgres` — its two stores
  (:mod:`~dpgate.ledger._lock` the writer locks of a file);
- :mod:`~dpgate.ledger._history`, :mod:`~dpgate.ledger._checkpoint` — a gateway's history kept
  in step with its ledger, and the checkpoint that makes re-opening fast;
- :mod:`~dpgate.ledger._provenance` — per-analyst charges and caps of ``dpgate serve``;
- :mod:`~dpgate.ledger._describe` — a released query in words, for ``Gateway.history``;
- :mod:`~dpgate.ledger._cell_spend` — the per-cell spent budget from the records (the console, ``Gateway.plot_cells``).
"""

from dpgate.ledger.core import FORMAT_VERSION, Ledger, LedgerRecord, LedgerTransaction

__all__ = ["FORMAT_VERSION", "Ledger", "LedgerRecord", "LedgerTransaction"]
