"""``python -m kwker_torch.quality`` (the old name of ``kwker_torch.tools.quality``, which it runs); importing it
gives that module itself."""

import importlib
import sys

_impl = importlib.import_module("kwker_torch.tools.quality")
if __name__ == "__main__":
    sys.exit(_impl.main())
sys.modules[__name__] = _impl
