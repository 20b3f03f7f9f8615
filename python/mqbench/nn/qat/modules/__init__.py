from mqbench.nn.qat.modules.deconv import ConvTranspose2d  # noqa: F401
from mqbench.nn.qat.modules.embedding import Embedding  # noqa: F401
