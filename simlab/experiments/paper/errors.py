"""The study's two failures: the user's (exit status 2) and a multirun's (exit status 1)."""


class PaperError(Exception):
    """A problem of the user's making (bad argument, an output directory holding another run):
    one line, exit status 2."""


class StudyFailed(Exception):
    """A multirun failed; what finished is kept and a rerun resumes (exit status 1)."""
