"""``python -m kwker_torch.demo`` (the old name of ``kwker_torch.tools.demo``, which it runs); importing it
gives that module itself."""

import importlib
import sys

_impl = importlib.import_module("kwker_torch.tools.demo")
if __name__ == "__main__":
    sys.exit(_impl.main())
sys.modules[__name__] = _impl
