"""Entry point of the frozen app: the same ``duplexcadence`` command as ``app.main:main``."""
import multiprocessing
import sys

from app.main import main

if __name__ == "__main__":
    multiprocessing.freeze_support()     # a no-op unless a child process re-enters the frozen binary
    sys.exit(main())
