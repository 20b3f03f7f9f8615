"""``python -m mqbench.llm`` (the console script ``mqbench-llm``): a transformers checkpoint
quantized block by block into a compressed-tensors checkpoint (``quantize_checkpoint``)."""
import argparse
import ast
import sys

_EPILOG = """\
examples:
  python -m mqbench.llm Llama-3.2-1B Llama-3.2-1B-W4 --algorithm gptq --bits 4 \\
      --group-size 128 --calib calib.jsonl
  mqbench-llm Qwen3-8B Qwen3-8B-W4 --algorithm rtn --bits 4 --group-size 128 --asym

A stopped run resumes when the same command runs again. On several processes (every
algorithm; a mixture of experts in one process):
  torchrun --nproc-per-node 2 -m mqbench.llm MODEL SAVE --algorithm gptq ...
(docs/llm.md)."""


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parser():
    from mqbench.llm.stream import ALGORITHMS
    p = argparse.ArgumentParser(
        prog="mqbench-llm", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantize a transformers checkpoint block by block (the whole model is never "
                    "in memory) into a compressed-tensors checkpoint that vLLM, SGLang and "
                    "transformers load.")
    p.add_argument("model_dir", help="the checkpoint folder (config.json, safetensors)")
    p.add_argument("save_dir", help="the output folder (resumed when it holds this run)")
    p.add_argument("--algorithm", required=True, choices=ALGORITHMS)
    p.add_argument("--bits", type=int, default=4, help="weight bits (default 4)")
    p.add_argument("--group-size", type=int, default=128,
                   help="input channels per scale; 0 for one scale per output channel "
                        "(default 128)")
    p.add_argument("--asym", action="store_true", help="affine grid (zero points); default "
                   "symmetric")
    p.add_argument("--act-order", action="store_true", help="gptq: columns by decreasing "
                   "Hessian diagonal")
    p.add_argument("--calib", help="token ids (.pt LongTensor [n, seq]) or text (.jsonl with a "
                   "'text' field, .txt); not used by rtn")
    p.add_argument("--nsamples", type=int, default=128, help="rows of text calibration "
                   "(default 128)")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per row of text calibration "
                   "(default 512)")
    p.add_argument("--ignore", nargs="*", default=["lm_head"], metavar="NAME",
                   help="Linear layers left float (default: lm_head)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="another argument of the algorithm, e.g. --set damp=0.05 "
                        "--set iters=100 (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="replace a SAVE_DIR holding "
                   "something else")
    p.add_argument("--keep-activations", action="store_true", help="keep the calibration "
                   "rows' hidden states in memory while GPTQ quantizes a block's layers and "
                   "while a block is encoded (by default they wait in a temporary file of "
                   "SAVE_DIR: less memory, a write and a read of them per block)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    from mqbench.llm.stream import quantize_checkpoint
    kwargs = {}
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            parser().error(f"--set takes KEY=VALUE, got {item!r}")
        kwargs[key] = _value(text)
    if args.act_order:
        if args.algorithm != "gptq":
            parser().error("--act-order is gptq's")
        kwargs["act_order"] = True
    scheme = {"bit": args.bits, "symmetry": not args.asym, "per_channel": True,
              "group_size": args.group_size if args.group_size > 0 else None}
    try:
        quantize_checkpoint(args.model_dir, args.save_dir, args.algorithm, scheme,
                            calib_data=args.calib, nsamples=args.nsamples, seqlen=args.seqlen,
                            ignore=tuple(args.ignore), overwrite=args.overwrite,
                            offload_activations=not args.keep_activations, **kwargs)
    except ValueError as e:
        print(f"mqbench-llm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mqbench-llm: stopped; run the same command again to resume from the first "
              f"block not written in {args.save_dir}", file=sys.stderr)
        return 130
    finally:
        _end_group()
    print(f"mqbench-llm: wrote {args.save_dir}")
    return 0


def _end_group():
    """The torch.distributed group of a torchrun job, ended with the run."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
