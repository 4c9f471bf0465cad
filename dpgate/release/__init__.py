"""Stage "release": the true answers, counted by the data engine, and the noise added to them.

- :mod:`~dpgate.release.cube` — exact counts per cell through SQL dpgate generates
  (:mod:`~dpgate.release._cube_sql` builds that SQL, :mod:`~dpgate.release._cube_batch` answers
  many queries from one histogram), run by a :mod:`dpgate.backends` engine;
- :mod:`~dpgate.release.noise` — secure discrete Laplace noise on a rational lattice;
- :mod:`~dpgate.release._gaussian` — secure discrete Gaussian noise on the same lattice (zCDP mode).
"""
