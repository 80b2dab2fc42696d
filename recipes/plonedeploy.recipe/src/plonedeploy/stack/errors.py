"""The one error of bin/stack's operations."""


class StackError(Exception):
    """A stack operation failed; the message says which process and why."""
