"""Mixed-precision bit-width selection (MQBench's ``mqbench.mix_precision``).

MQBench ships this folder without an ``__init__.py`` (a namespace package); ours has this
one so that the package is found by every packaging tool. Import the modules as in MQBench::

    from mqbench.mix_precision.mix_precision import mixprecision_profiling, ILP_bit_selection
    from mqbench.mix_precision.hessian_per_layer import hessian_per_layer

See docs/mix_precision.md.
"""
