"""fleetserve.modelstore: locate, assemble and convert model weights (offline).

Entry points: :class:`ModelStore` (``resolve(source)``) and :func:`default_model_dir`.
"""

from fleetserve.modelstore.store import ModelStore, cache_root, default_model_dir

__all__ = ["ModelStore", "cache_root", "default_model_dir"]
