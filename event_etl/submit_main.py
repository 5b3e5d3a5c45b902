"""The driver of ``event-etl submit`` under spark-submit, by its path of release 0.1 (bundles and
entry scripts may name it): the command is :func:`event_etl.cli.submitted.main`."""

from event_etl.cli.submitted import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    main()
