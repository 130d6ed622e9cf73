"""The old name of ``kwker_torch.compile.backend`` (the ``torch_dynamo_backends`` entry point's former target).
Importing it gives that module itself."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("kwker_torch.compile.backend")
