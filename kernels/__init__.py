"""pegmask.kernels: token bitmasks (allocation, packing) and applying them to logits.

`apply_token_bitmask_inplace` runs the triton kernel on CUDA tensors and a torch path elsewhere.
"""

if __name__ == "kernels":
    # This folder was imported as the top-level `kernels`: the repository root is on sys.path
    # (`python -m ...`, `python -c` or a script run in a checkout). That name belongs to the PyPI
    # package transformers imports (`from kernels import ...`), so the installed one takes this
    # module's place. Without one, the module stays empty, as if `kernels` were not installed.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec(__name__, _path)
    if _spec is not None and _spec.loader is not None:
        _installed = importlib.util.module_from_spec(_spec)
        sys.modules[__name__] = _installed
        try:
            _spec.loader.exec_module(_installed)
        except BaseException:
            del sys.modules[__name__]
            raise
else:
    from pegmask.kernels.apply import apply_token_bitmask_inplace
    from pegmask.kernels.bitmask import (
        BITMASK_DTYPE,
        allocate_token_bitmask,
        bitmask_words,
        pack_bool_mask,
        reset_token_bitmask,
        unpack_bitmask,
    )
    from pegmask.kernels.sampling import sample_masked

    __all__ = [
        "BITMASK_DTYPE",
        "allocate_token_bitmask",
        "apply_token_bitmask_inplace",
        "bitmask_words",
        "pack_bool_mask",
        "reset_token_bitmask",
        "sample_masked",
        "unpack_bitmask",
    ]
