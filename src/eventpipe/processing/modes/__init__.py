"""What is built on a run: stream destinations (``stream.py``), days rebuilt from the
archive (``reprocess.py``), replays of failed/ (``replay.py``), a new destination filled
from the archive (``fill.py``), the log's tools (``log_steps.py``), previews
(``preview.py``), and the class-data archive's training run (``training.py``)."""
