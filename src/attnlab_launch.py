"""attnlab's console script: the command line's ``main``, imported under a Ctrl-C guard.

It lives outside the package on purpose. Importing ``attnlab`` loads numpy and the whole library (half a second
or more); a Ctrl-C in that time would otherwise end in a KeyboardInterrupt traceback, printed before any of
attnlab's own code could catch it. Here nothing but ``sys`` is imported before the guard is in place.
"""

import sys


def main() -> int:
    """Run ``attnlab`` with ``sys.argv``; a Ctrl-C at any point is one line and exit code 130."""
    try:
        from attnlab.cli import program
        return program()
    except KeyboardInterrupt:
        print("\nattnlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
