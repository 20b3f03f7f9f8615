"""MQBench's ``mqbench.nn``: fused and QAT modules."""
