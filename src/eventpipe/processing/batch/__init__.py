"""A batch run: planned, read (``read.py``), shaped (``shape.py``), loaded into tables
(``load.py``) or sent to sinks (``send.py``), its failures recorded (``failures.py``), its
segments archived (``archiving.py``), a run that fails on its data isolated
(``isolation.py``); ``job.py`` strings them together, ``run.py`` is what they share."""
