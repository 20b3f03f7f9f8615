"""Per-layer Hessian information for HAWQ (MQBench's ``mix_precision.hessian_per_layer``).

``hessian_per_layer`` gives, for every ``Conv2d`` / ``Linear`` layer of a model, the largest
eigenvalue (power iteration) and the trace (Hutchinson's estimator) of the Hessian of the loss
with respect to that layer's weight: the diagonal block ``H_ll = d^2 L / dW_l^2`` of the full
Hessian. ``hessian_per_layer_acti`` does the same with respect to each layer's output
activation.

MQBench subclasses PyHessian's ``hessian`` class. PyHessian (PyPI ``pyhessian`` 0.1, last
released in 2021, GPL-3.0) is not a dependency here: the only thing it contributes is the
Hessian-vector product, which is two lines of ``torch.autograd`` (double backward, Pearlmutter's
trick)::

    g = dL/dW                        (autograd.grad with create_graph=True, kept)
    H v = d<g, v>/dW                 (autograd.grad of g with grad_outputs=v)

so the Hessian itself is never formed. Differences from MQBench/PyHessian (docs/compatibility.md):
the random vectors come from ``generator`` (reproducible), the model's train/eval mode and the
parameters' ``.grad`` are left as they were (PyHessian leaves the model in eval mode and the
``.grad`` fields holding a graph), data are moved to the model's device (``cuda`` is accepted
and ignored), and the trace returned is the mean of all samples drawn.

Example::

    comp = hessian_per_layer(model, torch.nn.CrossEntropyLoss(), data=(x, y),
                             generator=torch.Generator().manual_seed(0))
    comp.layer_trace()        # {'conv1': 12.3, 'fc': 4.5}
    comp.layer_eigenvalues()  # {'conv1': 3.1, 'fc': 2.2}
"""
from contextlib import contextmanager
from typing import Callable, Dict

import numpy as np
import torch
from torch import nn

from mqbench.utils.utils import model_device, to_device

__all__ = ["hessian_per_layer", "hessian_per_layer_acti", "LAYER_TYPES"]

#: The layers whose Hessian blocks are computed (MQBench's choice).
LAYER_TYPES = (nn.Conv2d, nn.Linear)

# Relative-change denominators never divide by zero (PyHessian's 1e-6).
_EPS = 1e-6


def _check_iter_args(maxIter, tol):  # noqa: N803  (MQBench's argument names)
    if isinstance(maxIter, bool) or not isinstance(maxIter, int) or maxIter < 1:
        raise ValueError(f"maxIter must be a positive int, got {maxIter!r}")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or tol < 0:
        raise ValueError(f"tol must be a float >= 0 (0 runs all maxIter iterations), got {tol!r}")


def power_iteration(hvp: Callable[[torch.Tensor], torch.Tensor], v: torch.Tensor, maxIter=100,
                    tol=1e-3):
    """Largest-magnitude eigenvalue of the symmetric operator ``hvp`` by power iteration.

    ``v`` is the start vector (any non-zero tensor of the operator's shape). Each step computes
    ``Hv``, the Rayleigh quotient ``<Hv, v>`` of the unit vector ``v`` and ``v <- Hv / |Hv|``;
    it stops when the quotient changes by less than ``tol`` relative to the previous one.
    Returns ``(eigenvalue, iterations)``; a zero operator gives ``(0.0, 1)``.
    """
    _check_iter_args(maxIter, tol)
    v = v / v.norm()
    eigenvalue = None
    for it in range(1, maxIter + 1):
        hv = hvp(v)
        estimate = float((hv * v).sum())
        norm = hv.norm()
        if float(norm) == 0.0:
            return 0.0, it
        v = hv / norm
        if eigenvalue is not None and abs(eigenvalue - estimate) / (abs(eigenvalue) + _EPS) < tol:
            return estimate, it
        eigenvalue = estimate
    return eigenvalue, maxIter


def hutchinson_trace(hvp: Callable[[torch.Tensor], torch.Tensor],
                     sample: Callable[[], torch.Tensor], maxIter=100, tol=1e-3):
    """Hutchinson's trace estimator: ``tr(H) = E[z^T H z]`` for Rademacher ``z`` (+-1 entries).

    ``sample()`` draws one ``z``. Stops when the running mean of ``z^T H z`` changes by less
    than ``tol`` relative to the previous mean (PyHessian's rule), or after ``maxIter`` samples.
    Returns ``(trace, samples drawn)``.
    """
    _check_iter_args(maxIter, tol)
    values = []
    mean = None
    for it in range(1, maxIter + 1):
        z = sample()
        values.append(float((hvp(z) * z).sum()))
        new_mean = float(np.mean(values))
        if mean is not None and abs(new_mean - mean) / (abs(mean) + _EPS) < tol:
            return new_mean, it
        mean = new_mean
    return mean, maxIter


@contextmanager
def _eval_mode(model):
    """The model in eval mode inside the block, its own modes (per module) restored after."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.training = training


def _second_grad(grad, wrt, v):
    """``d<grad, v>/d wrt``: the Hessian-vector product; zeros where ``grad`` does not depend
    on ``wrt`` (a layer the loss is linear in)."""
    if grad is None or not grad.requires_grad:
        return torch.zeros_like(wrt)
    hv, = torch.autograd.grad(grad, wrt, grad_outputs=v, retain_graph=True, allow_unused=True)
    return torch.zeros_like(wrt) if hv is None else hv.detach()


class _HessianBase:
    """What both classes share: argument checks, the data, the random vectors, the loops."""

    def __init__(self, model, criterion, data=None, dataloader=None, cuda=True, generator=None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(criterion):
            raise TypeError("criterion must be callable as criterion(output, target), e.g. "
                            "torch.nn.CrossEntropyLoss()")
        if (data is None) == (dataloader is None):
            raise ValueError("give exactly one of data=(inputs, targets) (one batch) or "
                             "dataloader (an iterable of (inputs, targets) batches)")
        if data is not None and (not isinstance(data, (tuple, list)) or len(data) != 2):
            raise ValueError("data must be a pair (inputs, targets)")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got "
                            f"{type(generator).__name__}")
        self.model = model
        self.criterion = criterion
        self.full_dataset = dataloader is not None
        self.data = dataloader if self.full_dataset else data
        self.cuda = cuda  # accepted for PyHessian's signature; the model's device decides
        self.device = model_device(model)
        self.generator = generator
        #: {layer name: iterations (power iteration) or samples (Hutchinson) of the last call}
        self.iterations: Dict[str, int] = {}
        self.layers = {name: mod for name, mod in model.named_modules()
                       if isinstance(mod, LAYER_TYPES)}
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no Conv2d or Linear layer to analyse")

    # -- random vectors -----------------------------------------------------------------------
    def _randn(self, like):
        g = self.generator
        if g is None:
            return torch.randn(like.shape, dtype=like.dtype, device=like.device)
        return torch.randn(like.shape, generator=g, dtype=like.dtype, device=g.device).to(
            like.device)

    def _rademacher(self, like):
        g = self.generator
        if g is None:
            bits = torch.randint(0, 2, like.shape, device=like.device)
        else:
            bits = torch.randint(0, 2, like.shape, generator=g, device=g.device).to(like.device)
        return bits.to(like.dtype) * 2 - 1

    def _loss(self, inputs, targets):
        return self.criterion(self.model(to_device(inputs, self.device)), to_device(targets, self.device))

    # -- the two estimators over every layer -------------------------------------------------
    def _hvp(self, name, v):
        raise NotImplementedError

    def _shape_of(self, name):
        raise NotImplementedError

    def layer_eigenvalues(self, maxIter=100, tol=1e-3) -> Dict[str, float]:  # noqa: N803
        """``{layer name: largest-magnitude eigenvalue of its Hessian block}`` by power
        iteration (at most ``maxIter`` Hessian-vector products per layer, stopping when the
        estimate changes by less than ``tol``, relatively)."""
        _check_iter_args(maxIter, tol)
        result = {}
        for name in self.layers:
            like = self._shape_of(name)
            value, iters = power_iteration(lambda v, n=name: self._hvp(n, v), self._randn(like),
                                           maxIter, tol)
            result[name] = value
            self.iterations[name] = iters
        return result

    def layer_trace(self, maxIter=100, tol=1e-3) -> Dict[str, float]:  # noqa: N803
        """``{layer name: trace of its Hessian block}`` by Hutchinson's estimator with
        Rademacher vectors (at most ``maxIter`` samples per layer, stopping when the running
        mean changes by less than ``tol``, relatively; ``tol=0`` draws all ``maxIter``)."""
        _check_iter_args(maxIter, tol)
        result = {}
        for name in self.layers:
            like = self._shape_of(name)
            value, iters = hutchinson_trace(lambda v, n=name: self._hvp(n, v),
                                            lambda: self._rademacher(like), maxIter, tol)
            result[name] = value
            self.iterations[name] = iters
        return result


class hessian_per_layer(_HessianBase):  # noqa: N801  (MQBench's class name)
    """Hessian blocks of the loss with respect to each Conv2d/Linear weight.

    Args:
        model: the float model (``nn.Module``); every Conv2d/Linear weight must require grad.
        criterion: ``criterion(model(inputs), targets)`` -> scalar loss.
        data: one batch ``(inputs, targets)``: its first-order gradients are computed once,
            with the graph kept, and every Hessian-vector product reuses them.
        dataloader: instead of ``data``, an iterable of ``(inputs, targets)``: each
            Hessian-vector product is the batch-size-weighted mean over all batches (one
            forward and two backward passes per batch).
        cuda: accepted for PyHessian's signature and ignored: the data go to the model's device.
        generator: a ``torch.Generator`` for the random start / probe vectors (reproducible
            results); None uses torch's global generator.

    The loss is evaluated in eval mode (BatchNorm with its running statistics, as PyHessian
    does); the model's modes are restored afterwards.
    """

    def __init__(self, model, criterion, data=None, dataloader=None, cuda=True, generator=None):
        super().__init__(model, criterion, data, dataloader, cuda, generator)
        frozen = [name for name, mod in self.layers.items() if not mod.weight.requires_grad]
        if frozen:
            raise ValueError(f"hessian_per_layer needs gradients of the layer weights; the "
                             f"weights of {frozen} do not require grad (call "
                             "weight.requires_grad_(True))")
        self.first_order_grad_dict = {}
        if not self.full_dataset:
            self.first_order_grad_dict = self._first_order_grads(*self.data)

    def _first_order_grads(self, inputs, targets):
        names = list(self.layers)
        weights = [self.layers[n].weight for n in names]
        with _eval_mode(self.model):
            loss = self._loss(inputs, targets)
        grads = torch.autograd.grad(loss, weights, create_graph=True, allow_unused=True)
        return dict(zip(names, grads))

    def _shape_of(self, name):
        return self.layers[name].weight.detach()

    def _hvp(self, name, v):
        weight = self.layers[name].weight
        if not self.full_dataset:
            return _second_grad(self.first_order_grad_dict[name], weight, v)
        total, count = torch.zeros_like(v), 0
        for inputs, targets in self.data:
            with _eval_mode(self.model):
                loss = self._loss(inputs, targets)
            grad, = torch.autograd.grad(loss, weight, create_graph=True, allow_unused=True)
            n = len(inputs) if hasattr(inputs, "__len__") else 1
            total += _second_grad(grad, weight, v) * n
            count += n
        if count == 0:
            raise ValueError("the dataloader gave no batch")
        return total / count


class hessian_per_layer_acti(_HessianBase):  # noqa: N801  (MQBench's class name)
    """Hessian blocks of the loss with respect to each Conv2d/Linear layer's output.

    The outputs are captured by forward hooks during one forward pass of ``data`` (the whole
    batch: the vectors have the activation's shape, batch dimension included). Only ``data``
    is supported (an activation differs from batch to batch). A layer called more than once
    in the forward pass is rejected. Other arguments as :class:`hessian_per_layer`.

    MQBench's version hard-codes CrossEntropyLoss and ``.cuda()``; this one uses
    ``criterion`` and the model's device.
    """

    def __init__(self, model, criterion, data=None, dataloader=None, cuda=True, generator=None):
        if dataloader is not None:
            raise ValueError("hessian_per_layer_acti works on one batch: pass data=(inputs, "
                             "targets), not a dataloader")
        super().__init__(model, criterion, data, dataloader, cuda, generator)
        self.layer_prepare(*data)

    def layer_prepare(self, data, target):
        """Runs the forward pass, keeps each layer's output and ``dL/d output`` (with graph)."""
        outputs, calls = {}, {}

        def hook(name):
            def save(module, inputs, output):
                calls[name] = calls.get(name, 0) + 1
                if not isinstance(output, torch.Tensor):
                    raise TypeError(f"layer {name} returned {type(output).__name__}, not a tensor")
                if not output.requires_grad:
                    output.requires_grad_(True)
                outputs[name] = output
                # Later in-place ops (ReLU(inplace=True)) act on the copy, so the kept tensor
                # stays the layer's output.
                return output.clone()
            return save

        handles = [mod.register_forward_hook(hook(name)) for name, mod in self.layers.items()]
        try:
            with _eval_mode(self.model):
                loss = self._loss(data, target)
        finally:
            for h in handles:
                h.remove()
        repeated = [n for n, c in calls.items() if c > 1]
        if repeated:
            raise ValueError(f"layers {repeated} run more than once in the forward pass; their "
                             "activation Hessian is not defined per layer")
        missing = [n for n in self.layers if n not in outputs]
        for n in missing:
            del self.layers[n]
        if not self.layers:
            raise ValueError("no Conv2d/Linear layer ran in the forward pass")
        names = list(self.layers)
        grads = torch.autograd.grad(loss, [outputs[n] for n in names], create_graph=True,
                                    allow_unused=True)
        self.acti_dict = {n: outputs[n] for n in names}
        self.grad_dict = dict(zip(names, grads))

    def _shape_of(self, name):
        return self.acti_dict[name].detach()

    def _hvp(self, name, v):
        return _second_grad(self.grad_dict[name], self.acti_dict[name], v)
