"""The op layer: the native library and the ``torch.ops.kwker.*`` it registers (``native``), their fake kernels
(``fake``) and autograd rules (``autograd``), and ``install()`` (``install``), which routes a model's
``nn.Linear`` and decode attention to them, each call shape where it measured faster (``path_choice``)."""

from . import native  # noqa: F401, I001  (first: loads the library, which registers the ops the others extend)
from . import autograd, fake  # noqa: F401
