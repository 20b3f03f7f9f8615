"""The algorithm ops (DSQ, TQT, PACT, NNIE, AdaRound, DoReFa, power-of-two and DFQ scales) on CUDA
against the CPU kernels (test_algorithm_ops.py checks those), and gradcheck on the device. The
comparison rules and the GPU skip: cuda_harness.py."""
import pytest
import torch

from cuda_harness import (CH_AXES, CLOSE, EXACT, FLOATS, INF, LAYOUTS, NNIE, REDUCED, ROUNDED,
                          Case, assert_agree, autograd, check_half_input_is_the_float_op_cast_back,
                          check_op_agrees_with_the_cpu_kernel, needs_gpu, on, per_channel)

ops = torch.ops.mqbench


def _dsq_pt(d):
    return on(d, [0.3]), on(d, [1], torch.int32)


def _pact(d):
    return on(d, [3.0]), on(d, [-2.5])


def _pact_qparams(d):
    return on(d, [5.5 / 255]), on(d, [116], torch.int32)


def algorithm_cases():
    c = [
        Case("dsq_per_tensor", lambda x, g, a, d: (
            ops.fake_quantize_dsq_per_tensor(x, *_dsq_pt(d), -8, 7, 0.4),), [ROUNDED]),
        Case("dsq_per_tensor_backward", lambda x, g, a, d: (
            ops._fake_quantize_dsq_per_tensor_backward(g, x, *_dsq_pt(d), -8, 7, 0.4),),
            [CLOSE(2e-6, 1e-13)]),
        Case("dsq_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t: ops.fake_quantize_dsq_per_tensor(t, *_dsq_pt(d), -8, 7, 0.4), x, g),
            [ROUNDED, CLOSE(2e-6, 1e-13)]),
        Case("tqt_activation_mth2", lambda x, g, a, d: (
            ops.fake_quantize_tqt(x, on(d, [0.013]), on(d, [0.0]), -128, 127, 2),), [EXACT]),
        Case("tqt_parameter_mth3", lambda x, g, a, d: (
            ops.fake_quantize_tqt(x, on(d, [0.013]), on(d, [0.0]), -128, 127, 3),), [EXACT]),
        Case("tqt_backward_mth2", lambda x, g, a, d: ops._fake_quantize_tqt_backward(
            g, x, on(d, [0.013]), on(d, [0.0]), -128, 127, 2), [EXACT, REDUCED()]),
        Case("tqt_backward_mth3", lambda x, g, a, d: ops._fake_quantize_tqt_backward(
            g, x, on(d, [0.3]), on(d, [0.0]), -8, 7, 3), [EXACT, REDUCED()]),
        Case("tqt_autograd", lambda x, g, a, d: autograd(
            lambda t, s: ops.fake_quantize_tqt(t, s, on(d, [0.0]), -128, 127, 2), x, g,
            on(d, [0.013])), [EXACT, EXACT, REDUCED()]),
        Case("pact_symmetric", lambda x, g, a, d: (ops.fake_quantize_pact(
            x, on(d, [3.0]), on(d, [-3.0]), on(d, [6.0 / 255]), on(d, [0], torch.int32),
            -128, 127),), [EXACT]),
        Case("pact_asymmetric", lambda x, g, a, d: (ops.fake_quantize_pact(
            x, *_pact(d), *_pact_qparams(d), 0, 255),), [EXACT]),
        Case("pact_no_lower_clip", lambda x, g, a, d: (ops.fake_quantize_pact(
            x, on(d, [2.0]), on(d, [-INF]), on(d, [0.05]), on(d, [0], torch.int32), -128, 127),),
            [EXACT]),
        Case("pact_backward", lambda x, g, a, d: ops._fake_quantize_pact_backward(
            g, x, *_pact(d), *_pact_qparams(d), 0, 255), [EXACT, REDUCED(), REDUCED()]),
        Case("pact_autograd", lambda x, g, a, d: autograd(
            lambda t, al, nal: ops.fake_quantize_pact(t, al, nal, *_pact_qparams(d), 0, 255),
            x, g, *_pact(d)), [EXACT, EXACT, REDUCED(), REDUCED()]),
        Case("nnie", lambda x, g, a, d: (ops.fake_quantize_nnie(x, on(d, 9.0)),), [NNIE]),
        Case("nnie_zero_range", lambda x, g, a, d: (ops.fake_quantize_nnie(x, on(d, 0.0)),),
             [EXACT]),
        Case("nnie_autograd", lambda x, g, a, d: autograd(
            lambda t: ops.fake_quantize_nnie(t, on(d, 9.0)), x, g), [NNIE, EXACT]),
        Case("adaround_per_tensor_soft", lambda x, g, a, d: (
            ops.fake_quantize_adaround_per_tensor(x, on(d, [0.02]), on(d, [0], torch.int32), a,
                                                  -128, 127, False),),
            [CLOSE(1e-6, 1e-14)], x_scale=0.3),
        Case("adaround_per_tensor_hard", lambda x, g, a, d: (
            ops.fake_quantize_adaround_per_tensor(x, on(d, [0.02]), on(d, [0], torch.int32), a,
                                                  -128, 127, True),), [EXACT], x_scale=0.3),
        Case("adaround_per_tensor_backward", lambda x, g, a, d: (
            ops._fake_quantize_adaround_per_tensor_backward(
                g, x, on(d, [0.02]), on(d, [0], torch.int32), a, -128, 127),),
            [CLOSE(2e-6, 1e-13)], x_scale=0.3),
        Case("adaround_per_tensor_autograd", lambda x, g, a, d: autograd(
            lambda t, al: ops.fake_quantize_adaround_per_tensor(
                t, on(d, [0.02]), on(d, [0], torch.int32), al, -128, 127, False), x, g, a),
            [CLOSE(1e-6, 1e-14), EXACT, CLOSE(2e-6, 1e-13)], x_scale=0.3),
        Case("dorefa_normalize", lambda x, g, a, d: (ops.dorefa_normalize(x),),
             [CLOSE(1e-6, 1e-14)], specials=False, half=False),
        Case("dorefa_normalize_autograd", lambda x, g, a, d: autograd(ops.dorefa_normalize, x, g),
             [CLOSE(1e-6, 1e-14), CLOSE(1e-5, 1e-12)], specials=False, half=False),
        Case("adaround_rectified_sigmoid", lambda x, g, a, d: (
            ops.adaround_rectified_sigmoid(x),), [CLOSE(1e-6, 1e-14)], half=False),
        Case("adaround_regularizer", lambda x, g, a, d: (
            ops.adaround_regularizer(x, 2.0), ops.adaround_regularizer(x, 20.0)),
            [REDUCED(), REDUCED()], specials=False, half=False),
        Case("adaround_alpha_init_per_tensor", lambda x, g, a, d: (
            ops.adaround_alpha_init(x, on(d, [0.05]), -1),), [CLOSE(1e-5, 1e-12)],
            specials=False, half=False),
    ]
    for ch in CH_AXES:
        c += [
            Case(f"dsq_per_channel[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_dsq_per_channel(x, *per_channel(x, ch, d, -8, 7), ch, -8, 7,
                                                  0.4),), [ROUNDED], x_scale=0.2),
            Case(f"dsq_per_channel_backward[{ch}]", lambda x, g, a, d, ch=ch: (
                ops._fake_quantize_dsq_per_channel_backward(
                    g, x, *per_channel(x, ch, d, -8, 7), ch, -8, 7, 0.4),),
                [CLOSE(2e-6, 1e-13)], x_scale=0.2),
            Case(f"adaround_per_channel_soft[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_adaround_per_channel(
                    x, *per_channel(x, ch, d, -128, 127), a, ch, -128, 127, False),),
                [CLOSE(1e-6, 1e-14)], x_scale=0.3),
            Case(f"adaround_per_channel_hard[{ch}]", lambda x, g, a, d, ch=ch: (
                ops.fake_quantize_adaround_per_channel(
                    x, *per_channel(x, ch, d, -128, 127), a, ch, -128, 127, True),),
                [EXACT], x_scale=0.3),
            Case(f"adaround_per_channel_backward[{ch}]", lambda x, g, a, d, ch=ch: (
                ops._fake_quantize_adaround_per_channel_backward(
                    g, x, *per_channel(x, ch, d, -128, 127), a, ch, -128, 127),),
                [CLOSE(2e-6, 1e-13)], x_scale=0.3),
        ]
    for ch in (0, 1, 3):  # adaround_alpha_init's ch_axis -1 is per tensor
        c.append(Case(f"adaround_alpha_init[{ch}]", lambda x, g, a, d, ch=ch: (
            ops.adaround_alpha_init(x, per_channel(x, ch, d, -128, 127)[0], ch),),
            [CLOSE(1e-5, 1e-12)], specials=False, half=False))
    return c


ALGORITHM_CASES = algorithm_cases()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=["float32", "float64"])
@pytest.mark.parametrize("case", ALGORITHM_CASES, ids=repr)
def test_algorithm_op_agrees_with_the_cpu_kernel(case, dtype, layout, device):
    check_op_agrees_with_the_cpu_kernel(case, dtype, layout, device)


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", [c for c in ALGORITHM_CASES if c.half], ids=repr)
def test_half_input_to_an_algorithm_op_on_cuda_is_the_float_op_cast_back(case, dtype, layout):
    check_half_input_is_the_float_op_cast_back(case, dtype, layout)


def test_tqt_power_of_two_step_next_to_a_power_of_two(device):
    """TQT's step 2^-floor(log2(1 / s)) where 1 / s lies within an ulp of a power of two (a
    scale at, one float above or one below 2^-k): log2f is within 1 ulp on both devices, not
    correctly rounded, so the floor could differ and double the step. Held to the CPU's."""
    x = torch.linspace(-3, 3, 4099)
    for k in range(-3, 14):
        p = torch.tensor([2.0 ** -k])
        for s in (p, torch.nextafter(p, p * 2), torch.nextafter(p, p / 2)):
            want = ops.fake_quantize_tqt(x, s, torch.zeros(1), -128, 127, 3)
            got = ops.fake_quantize_tqt(x.to(device), s.to(device), torch.zeros(1, device=device),
                                        -128, 127, 3)
            assert_agree(got, want, EXACT, torch.float32, x, f"tqt s={s.item()!r}")


def test_pot_quantization_and_dfq_scale_agree_with_the_cpu(device):
    s = torch.tensor([0.013, 0.25, 0.3, 7.0, 2.0 ** -20], dtype=torch.float64)
    for dtype in FLOATS:
        # Two leaves of their own (s.to(float64) would be s itself, and s.to(device) then no
        # leaf once s required a gradient).
        sc = s.to(dtype, copy=True).requires_grad_()
        sd = s.to(device=device, dtype=dtype, copy=True).requires_grad_()
        w, o = ops.pot_quantization(sc), ops.pot_quantization(sd)
        assert_agree(o, w.detach(), EXACT, dtype, sc, "pot_quantization")
        w.sum().backward()
        o.sum().backward()
        assert_agree(sd.grad, sc.grad, CLOSE(1e-6, 1e-14), dtype, sc, "pot_quantization grad")
    g = torch.Generator().manual_seed(4)
    w1, w2 = torch.randn(8, 4, 3, 3, generator=g), torch.randn(6, 8, 3, 3, generator=g)
    w1[2] *= 0.01
    w2[:, 5] = 0  # a dead channel keeps scale 1
    dw = torch.randn(16, 1, 3, 3, generator=g)  # a depthwise layer 2 of 16 channels
    w1d = torch.randn(16, 4, 1, 1, generator=g)
    for a, b in [(w1, w2), (w1.transpose(2, 3), w2.transpose(2, 3)), (w1d, dw)]:
        for args in [(), (1e-6, 1.5, 1e-8)]:
            want = ops.dfq_equalization_scale(a, b, *args)
            got = ops.dfq_equalization_scale(a.to(device), b.to(device), *args)
            assert_agree(got, want, EXACT, torch.float32, want, f"dfq {tuple(a.shape)} {args}")


# ---- gradcheck in float64 (points away from rounding ties and clamp kinks) ---------------------

def test_gradcheck_on_device(device):
    """The gradients of the CPU suite's gradchecks (DoReFa, AdaRound's alpha, its rectified
    sigmoid and regularizer) and, with the straight-through rounding taken out of the numeric
    side, the input gradients of the per-channel affine, DSQ and NNIE ops."""
    f64 = dict(dtype=torch.float64, device=device)
    g = torch.Generator().manual_seed(6)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device)

    gradcheck = torch.autograd.gradcheck
    assert gradcheck(ops.dorefa_normalize, (rand(6, 5).requires_grad_(),))
    w = rand(4, 6, scale=0.3)
    scale = torch.tensor([0.05, 0.04, 0.03, 0.02]).to(device)
    zp = torch.zeros(4, dtype=torch.int32, device=device)
    assert gradcheck(lambda a: ops.fake_quantize_adaround_per_channel(
        w, scale, zp, a, 0, -128, 127, False), (rand(4, 6).requires_grad_(),))
    assert gradcheck(lambda a: ops.fake_quantize_adaround_per_tensor(
        w, scale[:1], zp[:1], a, -128, 127, False), (rand(4, 6).requires_grad_(),))
    assert gradcheck(lambda a: ops.adaround_regularizer(a, 3.0), (rand(17).requires_grad_(),))
    assert gradcheck(ops.adaround_rectified_sigmoid,
                     (torch.linspace(-2.2, 2.2, 23, **f64).requires_grad_(),))
    # Per-channel affine: the numeric side of op(t) - (fq(t) - t).detach() is t inside the range.
    pc_scale = torch.tensor([0.1, 0.07, 0.13]).to(device)
    pc_zp = torch.tensor([0, 3, -2], dtype=torch.int32, device=device)
    t = (torch.linspace(-0.41, 0.43, 21, **f64).reshape(7, 3) + 0.013).requires_grad_()

    def per_channel_ste(v):
        out = ops.fake_quantize_per_channel_affine(v, pc_scale, pc_zp, 1, -128, 127)
        return out - (out.detach() - v.detach())
    assert gradcheck(per_channel_ste, (t,))
    # DSQ: the smooth phi with the straight-through round, u = x/s + z inside [qmin, qmax].
    ks = 1 / (1 - 0.4)
    k = torch.log(torch.tensor((ks + 1) / (ks - 1), dtype=torch.float64)).item()

    def dsq_ste(v):
        out = ops.fake_quantize_dsq_per_tensor(v, torch.tensor([0.3]).to(device),
                                               torch.tensor([1]).to(device), -8, 7, 0.4)
        u = v.detach() / 0.3 + 1
        f = torch.floor(u)
        phi = f + 0.5 * ks * torch.tanh(k * (u - f - 0.5)) + 0.5
        return out - (out.detach() - (phi - 1) * 0.3)
    # x/s + z in [-5.6, 6.8], inside [-8, 7]
    assert gradcheck(dsq_ste, (torch.linspace(-2.0, 1.75, 40, **f64).add(0.011).requires_grad_(),))

    def nnie_ste(v):
        out = ops.fake_quantize_nnie(v, torch.tensor(4.0).to(device))
        return out - (out.detach() - v.detach())
    assert gradcheck(nnie_ste, (rand(30).requires_grad_(),))
