"""The checkpoint being quantized, read lazily: its config, the model built on the meta device
(no memory), its chain of decoder blocks, and each module's tensors read from the safetensors
shards when that module is needed, checked against the model's own shapes.

A shard is opened for one read and closed after it: safetensors maps the file, and pages of a
mapping left open count in the process's resident memory, so a run that kept every shard open
would show the whole checkpoint in its RSS by the last block.
"""
import os

import torch

from mqbench.llm import _blocks, _experts, _layers, _memory
from mqbench.llm.checkpoint import _files, _names

WHO = "quantize_checkpoint"


class Source(object):
    """``model_dir``, a transformers checkpoint folder in safetensors (module docstring)."""

    def __init__(self, model_dir):
        import transformers
        self.path = os.path.abspath(model_dir)
        if not os.path.isdir(self.path):
            raise ValueError(f"{WHO}: {self.path} is not a folder (a transformers checkpoint: "
                             "config.json and safetensors shards)")
        cfg = _files.read_json(os.path.join(self.path, "config.json"), "config.json", WHO)
        self.config_dict = cfg
        self.config = transformers.AutoConfig.from_pretrained(self.path)
        files, weight_map = _files.shard_files(self.path, WHO)
        self.files = files
        self.disk = {}  # tensor name on disk -> shard file
        from safetensors import safe_open
        for fname in files:
            with safe_open(os.path.join(self.path, fname), framework="pt") as f:
                for k in f.keys():
                    if weight_map is not None and weight_map.get(k) != fname:
                        raise ValueError(f"{WHO}: {fname} holds {k!r}, which the index puts in "
                                         f"{weight_map.get(k)!r}")
                    self.disk[k] = fname
        if weight_map is not None:
            missing = sorted(set(weight_map) - set(self.disk))
            if missing:
                raise ValueError(f"{WHO}: the shard index names tensors no shard holds: "
                                 f"{missing[:5]}")
        self.dtype = self._stored_dtype()
        self.model = self._skeleton()
        self.blocks = self._blocks()

    def _stored_dtype(self):
        """The dtype of the checkpoint's floating-point tensors (one; the float parts are written
        back in it)."""
        from safetensors import safe_open
        found = set()
        for fname in self.files:
            with safe_open(os.path.join(self.path, fname), framework="pt") as f:
                for k in f.keys():
                    if self.disk.get(k) == fname:
                        dt = f.get_slice(k).get_dtype()
                        if dt in ("F32", "F16", "BF16"):
                            found.add(dt)
        if not found:
            raise ValueError(f"{WHO}: {self.path} holds no float32, float16 or bfloat16 tensor")
        if len(found) > 1:
            raise ValueError(f"{WHO}: {self.path} mixes float dtypes {sorted(found)}; a float "
                             "checkpoint in one dtype is expected")
        return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[found.pop()]

    def _skeleton(self):
        import transformers
        archs = self.config_dict.get("architectures") or []
        cls = getattr(transformers, archs[0], None) if archs and isinstance(archs[0], str) \
            else None
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            cls = None
        with torch.device("meta"):
            if cls is not None:
                model = cls._from_config(self.config, dtype=torch.float32)
            else:
                model = transformers.AutoModelForCausalLM.from_config(self.config,
                                                                      dtype=torch.float32)
        model.eval()
        self.cls = type(model)
        # the model's names of the tensors on disk (Mixtral's block_sparse_moe is its mlp)
        self.names = _names.KeyNames(model)
        self.where = {}  # the model's tensor name -> (shard file, name on disk)
        for k, fname in self.disk.items():
            name = self.names.to_model(k)
            if name in self.where:
                raise ValueError(f"{WHO}: {k!r} and {self.where[name][1]!r} in {self.path} are "
                                 f"both the model's {name!r}")
            self.where[name] = (fname, k)
        state = model.state_dict(keep_vars=True)
        seen, self.keys, self.aliases = {}, [], {}
        for k, v in state.items():
            if id(v) in seen:
                self.aliases[k] = seen[id(v)]
            else:
                seen[id(v)] = k
                self.keys.append(k)
        # fused experts: on disk one Linear per expert (Qwen3-MoE, Mixtral) or fused (GPT-OSS)
        self.expert_names = _experts.expert_names(self.config)
        with _experts.ExpertView(model, names=self.expert_names) as view:
            split = set(model.state_dict())
            self.routers = list(view.routers)
        experts = [n for n, _ in _experts.fused_experts(model)]
        buffers = {n for n, _ in model.named_buffers()}

        def held(k):
            if k in self.where or k in buffers:
                return True
            owner = next((e for e in experts if k.startswith(e + ".")), None)
            # a fused parameter: held when every per-expert tensor of its module is
            return owner is not None and all(s in self.where for s in split
                                             if s.startswith(owner + "."))
        missing = [k for k in self.keys if not held(k)]
        if missing:
            raise ValueError(f"{WHO}: {self.path} lacks {len(missing)} tensors of "
                             f"{self.cls.__name__} (first {missing[:3]}); the checkpoint does not "
                             "match its config.json")
        unknown = sorted(set(self.where) - set(state) - split)
        if unknown:
            raise ValueError(f"{WHO}: {self.path} holds {len(unknown)} tensors "
                             f"{self.cls.__name__} does not have (first {unknown[:3]})")
        return model

    def _blocks(self):
        names = [n for n, m in self.model.named_modules() if _layers.is_linear(m)]
        blocks = _blocks.find_blocks(self.model, names)
        if not blocks:
            raise ValueError(
                f"{WHO}: no chain of decoder blocks found in {self.cls.__name__}: expected an "
                "nn.ModuleList of at least two blocks holding its Linear layers (a decoder's "
                "model.layers, GPT-2's transformer.h)")
        return blocks

    def read(self, names, dtype=torch.float32):
        """name -> tensor of the named checkpoint tensors, floats as ``dtype`` (None: as
        stored; the others always as stored), each checked against the model's shape."""
        from safetensors import safe_open
        expected = dict(self.model.state_dict(keep_vars=True))
        by_file = {}
        for n in names:
            by_file.setdefault(self.where[n][0], []).append(n)
        out = {}
        for fname, keys in by_file.items():
            with safe_open(os.path.join(self.path, fname), framework="pt") as f:
                for k in keys:
                    t = f.get_tensor(self.where[k][1])
                    want = expected[k]
                    if tuple(t.shape) != tuple(want.shape):
                        raise ValueError(f"{WHO}: {k} is {list(t.shape)} in {fname}, "
                                         f"{self.cls.__name__} wants {list(want.shape)}")
                    out[k] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        return out

    def materialize(self, prefix, module, dtype=torch.float32):
        """Gives ``module`` (named ``prefix`` in the model, on the meta device) real CPU tensors:
        the checkpoint's, as ``dtype``. Fused experts held one Linear per expert on disk are
        filled through an ``ExpertView``; buffers the checkpoint does not hold (rotary
        frequencies) are computed by building their module again from the config."""
        pre = prefix + "." if prefix else ""
        params = [n for n, _ in module.named_parameters()]
        buffers = [n for n, _ in module.named_buffers()]
        fused = {}  # fused experts parameters the checkpoint holds per expert
        for mname, mod in _experts.fused_experts(module):
            for pname, _ in mod.named_parameters(recurse=False):
                full = f"{mname}.{pname}" if mname else pname
                if pre + full not in self.where:
                    fused[full] = (mod, pname)
        lacking = [n for n in params if pre + n not in self.where and n not in fused]
        if lacking:
            raise ValueError(f"{WHO}: the checkpoint lacks {pre}{lacking[0]}")
        computed = [n for n in buffers if pre + n not in self.where]
        for owner in sorted({n.rpartition(".")[0] for n in computed}):
            sub = module.get_submodule(owner) if owner else module
            try:
                with torch.device("cpu"):
                    fresh = type(sub)(config=self.config)
            except TypeError as e:
                raise ValueError(f"{WHO}: {pre}{owner or '(the block)'} has buffers the "
                                 f"checkpoint does not hold, and {type(sub).__name__}(config=...) "
                                 f"cannot build them ({e})") from None
            for n in computed:
                if n.rpartition(".")[0] == owner:
                    leaf = n.rpartition(".")[2]
                    sub._buffers[leaf] = fresh._buffers[leaf]
        held = [n for n in params + buffers if pre + n in self.where]
        tensors = self.read([pre + n for n in held], dtype)
        module.load_state_dict({n: tensors[pre + n] for n in held}, strict=False, assign=True)
        if fused:
            self._fill_experts(pre, module, fused, dtype)
        left = [n for n, t in list(module.named_parameters()) + list(module.named_buffers())
                if t.device.type == "meta"]
        if left:  # a parameter tied to one outside the module, or a buffer not in state_dict
            raise ValueError(f"{WHO}: {pre}{left[0]} is still on the meta device after reading "
                             "the checkpoint")
        return module

    def _fill_experts(self, pre, module, fused, dtype):
        """The fused parameters ``fused`` ({name: (module, parameter name)}) allocated and
        filled with the per-expert tensors on disk, through the views of an ExpertView."""
        for mod, pname in fused.values():
            shape = getattr(mod, pname).shape
            setattr(mod, pname, torch.nn.Parameter(torch.empty(shape, dtype=dtype)))
        owners = {n.rpartition(".")[0] for n in fused}
        with _experts.ExpertView(module, names=self.expert_names):
            views = {n: p for n, p in module.named_parameters()
                     if n.rpartition(".")[0].rpartition(".")[0].rpartition(".")[0] in owners}
            tensors = self.read([pre + n for n in views], dtype)
            with torch.no_grad():
                for n, p in views.items():
                    p.copy_(tensors[pre + n])


def release(module):
    """Sends ``module``'s tensors back to the meta device, their memory returned to the system:
    glibc keeps freed heap memory for reuse, and a block's weight-sized temporaries, freed in
    another order each block, left the heap growing by tens of MB a block (the RSS of a
    24-block model doubled) until ``malloc_trim`` gave it back (Note [Freed memory given
    back] in llm/_memory.py)."""
    module.to("meta")
    _memory.give_back()
