"""Public modules that moved into the layered packages keep answering at their old import paths.

``from kombu_akadze import outbox`` and ``import kombu_akadze.outbox`` (as the docs of 0.1 wrote
them) resolve to the same module object as ``kombu_akadze.integrations.outbox``: a finder maps the
old name and the import system takes the real module from ``sys.modules``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old module name (under kombu_akadze) -> where it lives now
MOVED = {
    "outbox": "integrations.outbox",
    "django": "integrations.django",
    "sqlalchemy": "integrations.sqlalchemy",
    "batch": "integrations.batch",
    "bootsteps": "integrations.bootsteps",
    "testing": "integrations.testing",
    "stats": "ops.stats",
    "metrics": "ops.metrics",
    "deadletters": "ops.deadletters",
    "cli": "ops.cli",
    "migrate": "store.migrate",
}
_PREFIX = "kombu_akadze."


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(_PREFIX) and fullname[len(_PREFIX) :] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import system reads sys.modules[name] back after exec_module: the real module is returned.
        sys.modules[module.__name__] = importlib.import_module(_PREFIX + MOVED[module.__name__[len(_PREFIX) :]])


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
