from .cli import program

raise SystemExit(program())
