"""``python -m eventpipe.cli``, and the file ``spark-submit`` runs (``eventpipe spark-entry``
prints its path): ``spark-submit --master URL <this file> process --once``."""

if __name__ == "__main__":
    from eventpipe.cli import main

    main()
