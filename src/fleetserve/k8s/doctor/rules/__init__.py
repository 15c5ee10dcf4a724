"""All doctor rule modules. Importing this package registers every rule.

Every module is imported unconditionally: a rule module that is missing from an install
(a packaging slip) or fails to import must fail the doctor loudly, never drop its rules
silently and report a clean cluster. A rule module must import nothing from another rule
module (shared facts live in the ``_*.py`` helpers).
"""

from __future__ import annotations

from fleetserve.k8s.doctor.rules import (  # noqa: F401 - imported to register their rules
    engine_args,
    gateway,
    hami,
    inputs,
    kuberay,
    lora,
    observability,
    scheduling,
    serve,
)
