"""MQBench's ``mqbench.quantization``: ``default_bias_fake_quant`` (the bias fake quantizer of
the Vitis-style modules) and ``qconfig_mapping_utils`` (``get_flattened_qconfig_dict``)."""
