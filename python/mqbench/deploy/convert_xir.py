"""MQBench's Vitis xmodel compiler (``python -m mqbench.deploy.convert_xir``): not provided.

MQBench's tool builds a Xilinx XGraph from the Vitis deploy's two ONNX files::

    python -m mqbench.deploy.convert_xir -Q N.onnx -C N_deploy_model.onnx -N N

It is built on Xilinx's Vitis-AI packages (``xir``, ``nndct_shared``, ``pytorch_nndct``), which
exist only inside the Vitis-AI docker image and cannot be installed or tested here. This module
keeps the command line and says what to do: run MQBench's own ``convert_xir`` inside that image
on the files ``convert_deploy(..., BackendType.Vitis)`` (or
``remove_fakequantize_and_collect_params(..., 'vitis')``) wrote; they have MQBench's names and
layout (docs/deploy.md, docs/compatibility.md).
"""
import argparse
import importlib.util
import sys

__all__ = ["parse_args", "main", "VITIS_AI_PACKAGES"]

#: The packages MQBench's convert_xir imports.
VITIS_AI_PACKAGES = ("xir", "nndct_shared", "pytorch_nndct")


def parse_args(argv=None):
    """MQBench's arguments: ``-Q/--qmodel``, ``-C/--cmodel``, ``-N/--name``."""
    parser = argparse.ArgumentParser(
        prog="python -m mqbench.deploy.convert_xir",
        description="Vitis xmodel compiler (MQBench's; needs Xilinx's Vitis-AI packages)")
    parser.add_argument("-Q", "--qmodel", required=True,
                        help="the ONNX model with fake quantization")
    parser.add_argument("-C", "--cmodel", required=True,
                        help="the deploy ONNX model (no fake quantization)")
    parser.add_argument("-N", "--name", required=True, help="the xmodel name")
    return parser.parse_args(argv)


def main(argv=None):
    """Parses the arguments, then stops with a message naming what is needed (exit status 1)."""
    args = parse_args(argv)
    missing = [p for p in VITIS_AI_PACKAGES if importlib.util.find_spec(p) is None]
    why = (f"Xilinx's Vitis-AI packages are not installed ({', '.join(missing)})" if missing
           else "mqbench does not reimplement the XIR conversion")
    sys.stderr.write(
        f"convert_xir: {why}. Run MQBench's own tool inside the Vitis-AI docker image on the "
        f"files mqbench wrote: python -m mqbench.deploy.convert_xir -Q {args.qmodel} "
        f"-C {args.cmodel} -N {args.name}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
