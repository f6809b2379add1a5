"""The test suite, a package so that its helpers are imported by name (``from tests.support import ...``).

``unit/`` runs in this process only; ``process/`` starts real daemons, front-ends and command lines.
``tests/README.md`` says which file covers what.
"""
