"""MQBench main's ``mqbench.tools``: helpers around a prepared model (``replace_syncbn``)."""
