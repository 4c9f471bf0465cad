"""Stage "schema": the public declarations every later stage reads.

- :mod:`~dpgate.schema.domains` — ``Schema``, ``Table``, ``Column``: what each column may hold;
- :mod:`~dpgate.schema._from_frame` — ``Schema.from_dataframe``, from a frame's *declarations*;
- :mod:`~dpgate.schema._frame_check` — a pandas frame's values against its declared domains.

Domains are declared by the data owner, never read from the data.
"""

from dpgate.schema.domains import NULL_LABEL, OTHER_LABEL, Column, Schema, Table

__all__ = ["Column", "NULL_LABEL", "OTHER_LABEL", "Schema", "Table"]
