"""SpinQuant's learned rotations (Liu et al. 2024, "SpinQuant: LLM quantization with learned
rotations"): ``rotate(mode="spinquant")`` starts from the random Hadamard R1 and R2 and learns
them on the calibration data by Cayley SGD on the orthogonal group (Note [Learning the
rotations])."""
import math

import torch
from torch.func import functional_call

from mqbench.llm import _calibration, _weights
from mqbench.llm._mappings import _get
from mqbench.llm._rotations import _Rotation
from mqbench.utils.logger import logger

# Note [Learning the rotations]
# The rotations are learned where they act: the model runs with every weight written as a
# function of R1 and the layers' R2 (the folds of Note [The rotations of a decoder], as
# differentiable products), each Linear's input rounded per token to the activation grid (and
# its weight to the weight grid when ``w_qscheme`` is given; SpinQuant's released code learns
# with float weights, which GPTQ rounds afterwards), straight-through gradients. The loss is the
# KL divergence from the float model's next-token distribution, per token, on the calibration
# items (SpinQuant trains on the cross-entropy with the data's next tokens; the KL to float
# measures what the rotation is for, the quantization's damage, and does not pull the rotations
# towards the calibration text). Only R1 and the R2s are parameters; the model's weights stay
# as they are until the learned matrices are folded.
#   * The step is Cayley SGD (Li et al. 2020): with G the Euclidean gradient of R (with
#     momentum), A = G R^T - R G^T is skew-symmetric and R <- (I + a/2 A)^-1 (I - a/2 A) R
#     stays orthogonal for every step size a (an exact solve; the dimensions are a hidden size
#     and a head size). a = lr_t / ||A||_F: the step's generator has norm lr_t whatever the
#     loss's scale (a KL of 1e-4 nats and one of 1 take the same steps), lr_t decaying from
#     ``lr`` to 0 on a cosine.
#   * The learned rotations are kept when their loss on the first calibration items (up to 8) is
#     at most the Hadamard start's; else the start is kept, so learning never leaves the model
#     worse on its own data than the Hadamard rotation.
#   * The folds then run in float64 with the learned (float32-trained, re-orthogonalised in
#     float64 by a QR step) matrices, and rotate's output check holds as for Hadamard rotations.

_CHECK_ITEMS = 8


def _dense(rot, device):
    eye = torch.eye(rot.n, dtype=torch.float64, device=device)
    return rot.right(eye)  # row i is e_i Q: the matrix Q itself


def _orthogonal(q):
    """The nearest orthogonal matrix's QR form: Q with R's diagonal signs folded back."""
    qq, r = torch.linalg.qr(q.double())
    return qq * torch.sign(torch.diagonal(r)).unsqueeze(0)


def _cayley(R, G, lr):
    A = G @ R.t() - R @ G.t()
    a = lr / max(A.norm().item(), 1e-30)
    eye = torch.eye(R.shape[0], dtype=R.dtype, device=R.device)
    return torch.linalg.solve(eye + 0.5 * a * A, (eye - 0.5 * a * A) @ R)


class _Weights(object):
    """The float weights (norms fused, R4 folded) and how R1 / R2 enter each of them."""

    def __init__(self, model, layout):
        self.base, self.plan = {}, []
        self.layout = layout

        def keep(name, kind, layer=None):
            mod = _get(model, name)
            self.base[name + ".weight"] = mod.weight.detach().float().clone()
            bias = getattr(mod, "bias", None)
            if bias is not None:
                self.base[name + ".bias"] = bias.detach().float().clone()
            self.plan.append((name, kind, layer))
        keep(layout["embed"], "embed")
        keep(layout["head"], "head")
        for i, prefix in enumerate(layout["layers"]):
            attn = _get(model, prefix).self_attn
            for p in ("q_proj", "k_proj"):
                keep(f"{prefix}.self_attn.{p}", "reads", i)
            keep(f"{prefix}.self_attn.v_proj", "v", i)
            keep(f"{prefix}.self_attn.o_proj", "o", i)
            for p in ("gate_proj", "up_proj"):
                keep(f"{prefix}.mlp.{p}", "reads", i)
            keep(f"{prefix}.mlp.down_proj", "writes", i)
            del attn

    def rotated(self, R1, R2s, wq):
        """{parameter name: tensor} of the model under R1 / R2s, Linear weights on the grid."""
        out = {}
        for name, kind, i in self.plan:
            w = self.base[name + ".weight"]
            b = self.base.get(name + ".bias")
            # the rotations go to each weight's device (a model spread over devices)
            R1 = R1.to(w.device)
            if kind in ("embed", "head", "reads"):
                w = w @ R1
            elif kind == "v":  # R2 on each head's output rows, then R1 on the input
                R2 = R2s[i].to(w.device)
                d = R2.shape[0]
                w = torch.einsum("de,hdi->hei", R2, w.view(-1, d, w.shape[1]))
                w = w.reshape(-1, w.shape[-1]) @ R1
                if b is not None:
                    b = (b.view(-1, d) @ R2).reshape(-1)
            elif kind == "o":  # R2 on each head's input columns, R1 on the output
                R2 = R2s[i].to(w.device)
                d = R2.shape[0]
                w = (w.view(w.shape[0], -1, d) @ R2).reshape(w.shape[0], -1)
                w = R1.t() @ w
                if b is not None:
                    b = b @ R1
            elif kind == "writes":
                w = R1.t() @ w
                if b is not None:
                    b = b @ R1
            if wq is not None and kind not in ("embed", "head"):
                w = _quantized(w, wq)
            out[name + ".weight"] = w
            if b is not None:
                out[name + ".bias"] = b
        return out


def _quantized(w, wq):
    """``w`` [out, in] on its min/max grid, straight-through (the qparams from the detached
    weight)."""
    out_f, in_f = w.shape
    group = wq.group_size or (in_f if wq.per_channel else None)
    view = w if group else w.reshape(1, -1)
    group = group or view.shape[1]
    g = view.detach().reshape(view.shape[0], -1, group)
    scale, zp = _weights.minmax_qparams(g.amin(-1), g.amax(-1), wq.quant_min, wq.quant_max,
                                        wq.symmetric)
    q = torch.ops.mqbench.fake_quantize_per_group_affine(view, scale, zp, 1, group, wq.quant_min,
                                                         wq.quant_max)
    return q.reshape(out_f, in_f)


class _ActQuant(object):
    """Per-token fake quantization of each Linear's input (pre-hooks), switchable: off while the
    float model computes the targets."""

    def __init__(self, model, layout, a_range):
        self.qmin, self.qmax, self.symmetric = a_range
        self.enabled = True
        self.handles = []
        for prefix in layout["layers"]:
            layer = _get(model, prefix)
            for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                        layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                        layer.mlp.down_proj):
                self.handles.append(lin.register_forward_pre_hook(self._hook))

    def _hook(self, module, args):
        if not self.enabled:
            return None
        return (torch.ops.mqbench.fake_quantize_per_token(
            args[0], self.qmin, self.qmax, self.symmetric, "int"),) + tuple(args[1:])

    def remove(self):
        for h in self.handles:
            h.remove()


def _a_range(a_qscheme):
    from mqbench.scheme import QuantizeScheme
    a = QuantizeScheme(**a_qscheme) if isinstance(a_qscheme, dict) else a_qscheme
    if not isinstance(a, QuantizeScheme) or a.is_float:
        raise ValueError(f"rotate: a_qscheme must be an integer scheme (dict of QuantizeScheme "
                         f"arguments), got {a_qscheme!r}")
    p = a.to_observer_params()
    return int(p["quant_min"]), int(p["quant_max"]), a.symmetry


def _logits(out):
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0]


def _loss(model, params, item, acts):
    """KL(float || rotated and quantized) per token, the float model's next-token distribution
    computed again without quantization (the model's own, unrotated, weights)."""
    if not (isinstance(item, dict) or hasattr(item, "keys")):
        raise ValueError("rotate(mode='spinquant'): each calibration item must be a dict of the "
                         "model's keyword inputs ({'input_ids': ...})")
    acts.enabled = False
    with torch.no_grad():
        target = _logits(model(**item)).float().log_softmax(-1)
    acts.enabled = True
    got = _logits(functional_call(model, params, args=(), kwargs=dict(item))).float()
    got = got.log_softmax(-1)
    return (target.exp() * (target - got)).sum(-1).mean()


def learn(model, layout, r1, r2s, calib_data, w_qscheme=None, a_qscheme=None, steps=100, lr=0.02,
          momentum=0.9):
    """R1 and each layer's R2 learned from the rotations ``r1`` / ``r2s`` (``_Rotation``);
    returns them as dense ``_Rotation`` objects, R1's with ``history`` (the loss per step)."""
    if not calib_data:
        raise ValueError("rotate(mode='spinquant') learns the rotations on calib_data: give "
                         "calibration items")
    items = list(calib_data)
    # SpinQuant's released code learns with float weights (W16A4): GPTQ rounds them afterwards
    wq = None if w_qscheme is None else _weights.resolve_w_qscheme(w_qscheme, "rotate")
    a_range = _a_range(a_qscheme or {"bit": 4, "symmetry": True})
    device = _calibration.input_device(model) or torch.device("cpu")
    weights = _Weights(model, layout)
    R1 = _dense(r1, device).float().requires_grad_()
    R2s = [_dense(r, device).float().requires_grad_() for r in r2s]
    params = [R1] + R2s
    moments = [torch.zeros_like(p) for p in params]
    acts = _ActQuant(model, layout, a_range)
    training = model.training
    model.eval()
    history = []
    start = [p.detach().clone() for p in params]
    try:
        for step in range(steps):
            loss = _loss(model, weights.rotated(R1, R2s, wq), items[step % len(items)], acts)
            history.append(loss.item())
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g, m in zip(params, grads, moments):
                    m.mul_(momentum).add_(g)
                    # cosine decay of the step length from lr to 0
                    p.copy_(_cayley(p, m, lr * 0.5 * (1 + math.cos(math.pi * step / steps))))
        # the rotations kept: the learned ones unless the start reads better on the data
        with torch.no_grad():
            check = items[:_CHECK_ITEMS]
            learned = sum(_loss(model, weights.rotated(R1, R2s, wq), c, acts).item()
                          for c in check)
            initial = sum(_loss(model, weights.rotated(start[0], start[1:], wq), c, acts).item()
                          for c in check)
    finally:
        acts.remove()
        model.train(training)
    keep = [p.detach() for p in params] if learned <= initial else start
    n = max(1, len(check))
    logger.info(f"rotate(mode='spinquant'): loss {history[0] if history else initial:.4g} -> "
                f"{history[-1] if history else initial:.4g} over {steps} steps; on "
                f"{len(check)} items {initial / n:.4g} (Hadamard) -> {learned / n:.4g} "
                f"(learned): kept the {'learned' if learned <= initial else 'Hadamard'} "
                "rotations")
    kept = [_orthogonal(t) for t in keep]
    out1 = _Rotation(r1.n, None, "R1", dense=kept[0])
    out1.history = history
    return out1, [_Rotation(r.n, None, "R2", dense=t) for r, t in zip(r2s, kept[1:])]
