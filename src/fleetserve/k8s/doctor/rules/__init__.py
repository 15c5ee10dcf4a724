"""All doctor rule modules. Importing this package registers every rule.

Each module is imported only if present, so rule groups can be built independently; a rule
module must import nothing from another rule module.
"""

from __future__ import annotations

import importlib

_RULE_MODULES = ("scheduling", "kuberay", "serve", "hami", "observability", "lora")

for _name in _RULE_MODULES:
    _full = f"{__name__}.{_name}"
    try:
        importlib.import_module(_full)
    except ModuleNotFoundError as e:
        if e.name != _full:
            raise
