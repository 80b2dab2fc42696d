"""``python -m loadtests fairness``: alias of ``python -m loadtests connections --fairness``
for this release; it goes in the next one (docs/reference/loadtests.md). Same options, same
report (``<out>/connections-<YYYYmmdd-HHMMSS>/``), same exit status; see
:mod:`loadtests.connections.connections`.

The one subcommand module that imports another: it is that subcommand under its old name.
"""
import sys

from loadtests.connections import connections


def main(argv=None):
    """``connections.main(["--fairness", *argv])``; a note on stderr names the new command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    print("note: 'fairness' is 'connections --fairness' now; this alias goes in the next release",
          file=sys.stderr)
    return connections.main(["--fairness", *argv], name="fairness")


if __name__ == "__main__":
    sys.exit(main())
