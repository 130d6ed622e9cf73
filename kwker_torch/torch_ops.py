"""The old (public) name of ``kwker_torch.ops.install``: ``kwker_torch.torch_ops.install()``. Importing it gives
that module itself."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("kwker_torch.ops.install")
