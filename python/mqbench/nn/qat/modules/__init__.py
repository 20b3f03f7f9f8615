from mqbench.nn.qat.modules.deconv import ConvTranspose2d  # noqa: F401
