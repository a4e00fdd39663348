//! The plain path of `comppo_core.gae`, `td_targets`, `gates_from_concentration`,
//! `masked_whiten` and `group_advantages`.
//!
//! When every array argument of a call is a NumPy array the kernel takes as it is
//! (native `float32` or `float64`, a `bool` mask, `int64` `cu_seqlens`, `float64`
//! `last_values`, all C-contiguous and shaped as the layout says; outputs of the input
//! dtype, writeable and apart from every input) and every scalar is in range, these
//! functions compute the result at once and return it. Otherwise they return `None`
//! having touched nothing, and the Python layer takes its general path, which converts
//! the arguments or raises the error that names the first bad one. So the two paths
//! differ only in speed: the kernels, and so the results and the kernels' own errors
//! (NaN, gate range, masked rewards, `cu_seqlens` values), are the same.
//!
//! Why: the general path runs a few hundred Python operations (coercion, layout
//! objects, output checks). Right after a large batch has streamed through the CPU's
//! caches, as in a training loop or `benches/compare.py`, each of them misses the
//! caches: on the 64 × 16384 batch of W2 the general path took ~140 µs before the
//! kernel started, in a call of ~850 µs. These checks take ~10 µs.

use super::{group_method, group_singleton, layout, to_pyerr, FloatDtype};
use crate::element::{AllValid, UnitGates};
use crate::gae::GaeParams;
use crate::gating::{GateParams, Normalize};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// `$f::<f32>(args)` or `$f::<f64>(args)` by the dtype of the NumPy array `$on`;
/// `Ok(None)` (the general path) for anything else.
macro_rules! by_plain_dtype {
    ($on:expr, $f:ident($($arg:expr),*)) => {
        if $on.is_instance_of::<PyArrayDyn<f32>>() {
            $f::<f32>($($arg),*)
        } else if $on.is_instance_of::<PyArrayDyn<f64>>() {
            $f::<f64>($($arg),*)
        } else {
            Ok(None)
        }
    };
}

/// Whether the kernels can read `a`'s data as a slice: C-contiguous and aligned (a
/// view into a byte buffer at an odd offset is contiguous but not aligned).
fn readable<'py>(a: &impl PyUntypedArrayMethods<'py>) -> bool {
    a.is_c_contiguous() && a.is_aligned()
}

/// `a` as a C-contiguous, aligned array of `T` with exactly `shape`, or None.
fn plain<'a, 'py, T: numpy::Element>(
    a: &'a Bound<'py, PyAny>,
    shape: &[usize],
) -> Option<&'a Bound<'py, PyArrayDyn<T>>> {
    let a = a.cast::<PyArrayDyn<T>>().ok()?;
    (a.shape() == shape && readable(a)).then_some(a)
}

/// An optional argument: `Some(None)` when absent, `Some(Some(array))` when plain,
/// `None` when present but not plain.
fn plain_opt<'a, 'py, T: numpy::Element>(
    a: &'a Option<Bound<'py, PyAny>>,
    shape: &[usize],
) -> Option<Option<&'a Bound<'py, PyArrayDyn<T>>>> {
    match a {
        None => Some(None),
        Some(a) => plain::<T>(a, shape).map(Some),
    }
}

/// The bytes an array's data occupies (the arrays here are C-contiguous).
fn bytes<T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &Bound<'_, numpy::PyArray<T, D>>,
) -> std::ops::Range<usize> {
    let start = a.data() as usize;
    start..start + a.len() * std::mem::size_of::<T>()
}

/// Whether any output overlaps an input or an output before it.
fn any_overlap(outputs: &[std::ops::Range<usize>], inputs: &[std::ops::Range<usize>]) -> bool {
    let meet = |a: &std::ops::Range<usize>, b: &std::ops::Range<usize>| a.start < b.end && b.start < a.end;
    outputs.iter().enumerate().any(|(k, o)| inputs.iter().chain(&outputs[..k]).any(|i| meet(o, i)))
}

/// A scalar argument as a float in [0, 1], or None.
fn unit(x: &Bound<'_, PyAny>) -> Option<f64> {
    x.extract::<f64>().ok().filter(|v| (0.0..=1.0).contains(v))
}

/// The layout of a plain call: padded `[B, T]`, or packed `[N]` with `int64` offsets.
struct PlainLayout<'a, 'py> {
    rows: usize,
    /// `(B, T)` when padded, `(0, 0)` when packed.
    grid: (usize, usize),
    cu_seqlens: Option<&'a Bound<'py, PyArray1<i64>>>,
}

/// The layout of a call whose first array has `shape`, or None when it is not plain.
fn plain_layout<'a, 'py>(shape: &[usize], cu_seqlens: &'a Option<Bound<'py, PyAny>>) -> Option<PlainLayout<'a, 'py>> {
    match (cu_seqlens, shape) {
        (None, &[rows, cols]) => Some(PlainLayout { rows, grid: (rows, cols), cu_seqlens: None }),
        (Some(cu), &[_]) => {
            let cu = cu.cast::<PyArray1<i64>>().ok().filter(|cu| readable(*cu) && cu.len() > 0)?;
            Some(PlainLayout { rows: cu.len() - 1, grid: (0, 0), cu_seqlens: Some(cu) })
        }
        _ => None,
    }
}

/// A read borrow of an optional array: `Some(None)` when absent, None when the borrow
/// fails (an overlapping write borrow elsewhere).
fn read_opt<'py, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: Option<&Bound<'py, numpy::PyArray<T, D>>>,
) -> Option<Option<numpy::PyReadonlyArray<'py, T, D>>> {
    match a {
        None => Some(None),
        Some(a) => a.try_readonly().ok().map(Some),
    }
}

/// Comp-GAE on the plain path: `(advantages, returns)`, or None (see the module).
#[pyfunction]
#[pyo3(signature = (rewards, values, mask, cu_seqlens, gates, last_values, out, gamma, lam, lam_critic, masked_rewards))]
#[allow(clippy::too_many_arguments)]
pub(super) fn gae_plain<'py>(
    py: Python<'py>,
    rewards: Bound<'py, PyAny>,
    values: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    gates: Option<Bound<'py, PyAny>>,
    last_values: Option<Bound<'py, PyAny>>,
    out: Option<Bound<'py, PyAny>>,
    gamma: Bound<'py, PyAny>,
    lam: Bound<'py, PyAny>,
    lam_critic: Option<Bound<'py, PyAny>>,
    masked_rewards: Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let Some(params) = gae_params(&gamma, &lam, &lam_critic, &masked_rewards) else { return Ok(None) };
    let call = SeqArgs { rewards, values, mask, cu_seqlens, gates, last_values, out };
    by_plain_dtype!(call.rewards, gae_typed(py, &call, &params))
}

/// One-step TD targets on the plain path: the targets, or None (see the module).
#[pyfunction]
#[pyo3(signature = (rewards, values, mask, cu_seqlens, gates, last_values, gamma))]
#[allow(clippy::too_many_arguments)]
pub(super) fn td_targets_plain<'py>(
    py: Python<'py>,
    rewards: Bound<'py, PyAny>,
    values: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    gates: Option<Bound<'py, PyAny>>,
    last_values: Option<Bound<'py, PyAny>>,
    gamma: Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(gamma) = unit(&gamma) else { return Ok(None) };
    let call = SeqArgs { rewards, values, mask, cu_seqlens, gates, last_values, out: None };
    by_plain_dtype!(call.rewards, td_typed(py, &call, gamma))
}

fn gae_params(
    gamma: &Bound<'_, PyAny>,
    lam: &Bound<'_, PyAny>,
    lam_critic: &Option<Bound<'_, PyAny>>,
    masked_rewards: &Bound<'_, PyAny>,
) -> Option<GaeParams> {
    let (gamma, lam) = (unit(gamma)?, unit(lam)?);
    let lam_critic = match lam_critic {
        None => lam,
        Some(l) => unit(l)?,
    };
    let drop_masked_rewards = match masked_rewards.extract::<&str>().ok()? {
        "error" => false,
        "drop" => true,
        _ => return None,
    };
    Some(GaeParams { gamma, lam, lam_critic, drop_masked_rewards })
}

/// The array arguments of a call on a sequence batch (`gae`, `td_targets`).
struct SeqArgs<'py> {
    rewards: Bound<'py, PyAny>,
    values: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    gates: Option<Bound<'py, PyAny>>,
    last_values: Option<Bound<'py, PyAny>>,
    out: Option<Bound<'py, PyAny>>,
}

/// Starts waking the pool (see [`crate::pool::wake_ahead`]) for a call on `rows` rows
/// of `len` positions in all that has passed its checks, so that the wake-up overlaps
/// allocating the outputs. A batch the kernels run on the calling thread wakes nothing:
/// one under [`crate::pool::PARALLEL_MIN`] positions, or a single row (tasks are whole
/// rows).
fn wake_pool_ahead(len: usize, rows: usize) {
    if len >= crate::pool::PARALLEL_MIN && rows > 1 {
        crate::pool::wake_ahead();
    }
}

/// The outputs of a plain call: `out`'s arrays when it is a tuple of `count` plain,
/// writeable arrays, fresh arrays when it is None; else None.
fn plain_outputs<'py, F: FloatDtype>(
    py: Python<'py>,
    out: &Option<Bound<'py, PyAny>>,
    shape: &[usize],
    count: usize,
) -> Option<Vec<Bound<'py, PyArrayDyn<F>>>> {
    match out {
        // SAFETY: the kernels write every position of their outputs.
        None => Some((0..count).map(|_| unsafe { PyArrayDyn::<F>::new(py, shape, false) }).collect()),
        Some(out) => {
            let out = out.cast::<PyTuple>().ok().filter(|t| t.len() == count)?;
            out.iter().map(|o| plain::<F>(&o, shape).cloned()).collect()
        }
    }
}

fn gae_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    c: &SeqArgs<'py>,
    p: &GaeParams,
) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let Some(SeqBorrows { outs, mut writes, reads, grid }) = seq_borrows::<F>(py, c, 2) else { return Ok(None) };
    let SeqSlices { r, v, g, m, lv, cu } = reads.slices();
    let (adv, ret) = writes.split_at_mut(1);
    let (adv_s, ret_s) = (adv[0].as_slice_mut().expect("contiguous"), ret[0].as_slice_mut().expect("contiguous"));
    let lay = layout(py, cu, grid, r.len())?;
    let result = match m {
        None => with_gates!(g, |g| py.detach(|| crate::gae::gae(&lay, r, v, AllValid, g, lv, p, adv_s, ret_s))),
        Some(m) => with_gates!(g, |g| py.detach(|| crate::gae::gae(&lay, r, v, m, g, lv, p, adv_s, ret_s))),
    };
    result.map_err(|e| to_pyerr(py, e))?;
    drop(writes);
    let mut outs = outs.into_iter().map(Bound::into_any);
    Ok(Some((outs.next().expect("two outputs"), outs.next().expect("two outputs"))))
}

fn td_typed<'py, F: FloatDtype>(py: Python<'py>, c: &SeqArgs<'py>, gamma: f64) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(SeqBorrows { outs, mut writes, reads, grid }) = seq_borrows::<F>(py, c, 1) else { return Ok(None) };
    let SeqSlices { r, v, g, m, lv, cu } = reads.slices();
    let o = writes[0].as_slice_mut().expect("contiguous");
    let lay = layout(py, cu, grid, r.len())?;
    let result = match m {
        None => with_gates!(g, |g| py.detach(|| crate::td::td_targets(&lay, r, v, AllValid, g, lv, gamma, o))),
        Some(m) => with_gates!(g, |g| py.detach(|| crate::td::td_targets(&lay, r, v, m, g, lv, gamma, o))),
    };
    result.map_err(|e| to_pyerr(py, e))?;
    drop(writes);
    Ok(outs.into_iter().next().map(Bound::into_any))
}

/// The arrays of a plain call on a sequence batch, borrowed.
struct SeqBorrows<'py, F: FloatDtype> {
    /// The outputs, to return.
    outs: Vec<Bound<'py, PyArrayDyn<F>>>,
    /// The outputs, borrowed for writing.
    writes: Vec<numpy::PyReadwriteArrayDyn<'py, F>>,
    reads: SeqReads<'py, F>,
    grid: (usize, usize),
}

/// The inputs of a plain call on a sequence batch, borrowed for reading.
struct SeqReads<'py, F: FloatDtype> {
    r: numpy::PyReadonlyArrayDyn<'py, F>,
    v: numpy::PyReadonlyArrayDyn<'py, F>,
    g: Option<numpy::PyReadonlyArrayDyn<'py, F>>,
    m: Option<numpy::PyReadonlyArrayDyn<'py, bool>>,
    lv: Option<numpy::PyReadonlyArrayDyn<'py, f64>>,
    cu: Option<numpy::PyReadonlyArray1<'py, i64>>,
}

/// [`SeqReads`] as the slices the kernels take.
struct SeqSlices<'a, F> {
    r: &'a [F],
    v: &'a [F],
    g: Option<&'a [F]>,
    m: Option<&'a [bool]>,
    lv: Option<&'a [f64]>,
    cu: Option<&'a [i64]>,
}

impl<F: FloatDtype> SeqReads<'_, F> {
    fn slices(&self) -> SeqSlices<'_, F> {
        // The arrays were checked C-contiguous before they were borrowed.
        SeqSlices {
            r: self.r.as_slice().expect("contiguous"),
            v: self.v.as_slice().expect("contiguous"),
            g: self.g.as_ref().map(|g| g.as_slice().expect("contiguous")),
            m: self.m.as_ref().map(|m| m.as_slice().expect("contiguous")),
            lv: self.lv.as_ref().map(|lv| lv.as_slice().expect("contiguous")),
            cu: self.cu.as_ref().map(|cu| cu.as_slice().expect("contiguous")),
        }
    }
}

/// The borrowed arrays of a call with `count` outputs, or None when any argument is
/// not plain.
fn seq_borrows<'py, F: FloatDtype>(py: Python<'py>, c: &SeqArgs<'py>, count: usize) -> Option<SeqBorrows<'py, F>> {
    let r = c.rewards.cast::<PyArrayDyn<F>>().ok().filter(|r| readable(*r))?;
    let shape = r.shape().to_vec();
    let lay = plain_layout(&shape, &c.cu_seqlens)?;
    let v = plain::<F>(&c.values, &shape)?;
    let g = plain_opt::<F>(&c.gates, &shape)?;
    let m = plain_opt::<bool>(&c.mask, &shape)?;
    let lv = plain_opt::<f64>(&c.last_values, &[lay.rows])?;
    let mut inputs = vec![bytes(r), bytes(v)];
    inputs.extend(g.map(bytes).into_iter().chain(m.map(bytes)).chain(lv.map(bytes)).chain(lay.cu_seqlens.map(bytes)));
    let (r, v) = (r.try_readonly().ok()?, v.try_readonly().ok()?);
    let (g, m, lv, cu) = (read_opt(g)?, read_opt(m)?, read_opt(lv)?, read_opt(lay.cu_seqlens)?);
    // A call that allocates its outputs starts waking the pool first, so that the
    // wake-up overlaps the allocation; one given `out` once `out` has passed.
    if c.out.is_none() {
        wake_pool_ahead(r.len(), lay.rows);
    }
    // The outputs last, so that a call that falls through has allocated nothing.
    let outs = plain_outputs::<F>(py, &c.out, &shape, count)?;
    let out_bytes: Vec<_> = outs.iter().map(bytes).collect();
    if c.out.is_some() && any_overlap(&out_bytes, &inputs) {
        return None;
    }
    // A read-only `out` fails to borrow here and takes the general path, which names it.
    let writes = outs.iter().map(|o| o.try_readwrite().ok()).collect::<Option<Vec<_>>>()?;
    if c.out.is_some() {
        wake_pool_ahead(r.len(), lay.rows);
    }
    Some(SeqBorrows { outs, writes, reads: SeqReads { r, v, g, m, lv, cu }, grid: lay.grid })
}

/// A scalar argument as a finite float, or None.
fn finite(x: &Bound<'_, PyAny>) -> Option<f64> {
    x.extract::<f64>().ok().filter(|v| v.is_finite())
}

/// Retention gates on the plain path: the gates, or None (see the module). Plain here
/// also means finite float parameters, a known `normalize` and a `bool` `invert`; the
/// kernel checks their ranges, as on the general path.
#[pyfunction]
#[pyo3(signature = (conc, mask, cu_seqlens, low, high, sharpness, normalize, center, scale, invert))]
#[allow(clippy::too_many_arguments)]
pub(super) fn gates_from_concentration_plain<'py>(
    py: Python<'py>,
    conc: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    low: Bound<'py, PyAny>,
    high: Bound<'py, PyAny>,
    sharpness: Bound<'py, PyAny>,
    normalize: Bound<'py, PyAny>,
    center: Bound<'py, PyAny>,
    scale: Bound<'py, PyAny>,
    invert: Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (Some(low), Some(high), Some(sharpness), Some(center), Some(scale)) =
        (finite(&low), finite(&high), finite(&sharpness), finite(&center), finite(&scale))
    else {
        return Ok(None);
    };
    let normalize = match normalize.extract::<&str>() {
        Ok("sequence") => Normalize::Sequence,
        Ok("batch") => Normalize::Batch,
        Ok("none") => Normalize::Fixed { center, scale },
        _ => return Ok(None),
    };
    let Ok(invert) = invert.cast::<pyo3::types::PyBool>().map(|b| b.is_true()) else { return Ok(None) };
    let params = GateParams { low, high, sharpness, normalize, invert };
    by_plain_dtype!(conc, gates_typed(py, &conc, &mask, &cu_seqlens, &params))
}

fn gates_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    conc: &Bound<'py, PyAny>,
    mask: &Option<Bound<'py, PyAny>>,
    cu_seqlens: &Option<Bound<'py, PyAny>>,
    params: &GateParams,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(c) = MaskedArray::<F>::plain(conc, mask, cu_seqlens) else { return Ok(None) };
    let Some(reads) = c.read() else { return Ok(None) };
    wake_pool_ahead(reads.x.len(), c.lay.rows);
    // The output last, so that a call that falls through has allocated nothing.
    // SAFETY: the kernel writes every position of its output.
    let out = unsafe { PyArrayDyn::<F>::new(py, &c.shape[..], false) };
    let Ok(mut o) = out.try_readwrite() else { return Ok(None) };
    let MaskedSlices { x, m, cu, grid } = reads.slices();
    let os = o.as_slice_mut().expect("contiguous");
    let l = layout(py, cu, grid, x.len())?;
    let result = match m {
        None => py.detach(|| crate::gating::gates_from_concentration(&l, x, AllValid, params, os)),
        Some(m) => py.detach(|| crate::gating::gates_from_concentration(&l, x, m, params, os)),
    };
    result.map_err(|e| to_pyerr(py, e))?;
    drop(o);
    Ok(Some(out.into_any()))
}

/// One float array with an optional bool mask and packed offsets, all plain, before
/// they are borrowed (`gates_from_concentration`, `masked_whiten`).
struct MaskedArray<'a, 'py, F: FloatDtype> {
    x: &'a Bound<'py, PyArrayDyn<F>>,
    shape: Vec<usize>,
    m: Option<&'a Bound<'py, PyArrayDyn<bool>>>,
    lay: PlainLayout<'a, 'py>,
}

impl<'a, 'py, F: FloatDtype> MaskedArray<'a, 'py, F> {
    /// The arrays when every one is plain, else None.
    fn plain(
        x: &'a Bound<'py, PyAny>,
        mask: &'a Option<Bound<'py, PyAny>>,
        cu_seqlens: &'a Option<Bound<'py, PyAny>>,
    ) -> Option<Self> {
        let x = x.cast::<PyArrayDyn<F>>().ok().filter(|x| readable(*x))?;
        let shape = x.shape().to_vec();
        let lay = plain_layout(&shape, cu_seqlens)?;
        let m = plain_opt::<bool>(mask, &shape)?;
        Some(MaskedArray { x, shape, m, lay })
    }

    /// The bytes of every array, for the overlap check against an output.
    fn input_bytes(&self) -> Vec<std::ops::Range<usize>> {
        let mut inputs = vec![bytes(self.x)];
        inputs.extend(self.m.map(bytes).into_iter().chain(self.lay.cu_seqlens.map(bytes)));
        inputs
    }

    /// The arrays borrowed for reading, or None when a borrow fails.
    fn read(&self) -> Option<MaskedReads<'py, F>> {
        let (x, m, cu) = (self.x.try_readonly().ok()?, read_opt(self.m)?, read_opt(self.lay.cu_seqlens)?);
        Some(MaskedReads { x, m, cu, grid: self.lay.grid })
    }
}

/// A [`MaskedArray`] borrowed for reading.
struct MaskedReads<'py, F: FloatDtype> {
    x: numpy::PyReadonlyArrayDyn<'py, F>,
    m: Option<numpy::PyReadonlyArrayDyn<'py, bool>>,
    cu: Option<numpy::PyReadonlyArray1<'py, i64>>,
    grid: (usize, usize),
}

/// [`MaskedReads`] as the slices the kernels take.
struct MaskedSlices<'a, F> {
    x: &'a [F],
    m: Option<&'a [bool]>,
    cu: Option<&'a [i64]>,
    grid: (usize, usize),
}

impl<F: FloatDtype> MaskedReads<'_, F> {
    fn slices(&self) -> MaskedSlices<'_, F> {
        // The arrays were checked C-contiguous before they were borrowed.
        MaskedSlices {
            x: self.x.as_slice().expect("contiguous"),
            m: self.m.as_ref().map(|m| m.as_slice().expect("contiguous")),
            cu: self.cu.as_ref().map(|cu| cu.as_slice().expect("contiguous")),
            grid: self.grid,
        }
    }
}

/// Masked whitening on the plain path: the whitened array, or None (see the module).
/// `out` is None or a plain array apart from `x` and `mask` (`out=x`, whitening in
/// place, takes the general path).
#[pyfunction]
#[pyo3(signature = (x, mask, cu_seqlens, shift_mean, eps, out))]
pub(super) fn masked_whiten_plain<'py>(
    py: Python<'py>,
    x: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    shift_mean: Bound<'py, PyAny>,
    eps: Bound<'py, PyAny>,
    out: Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Ok(shift_mean) = shift_mean.cast::<pyo3::types::PyBool>().map(|b| b.is_true()) else { return Ok(None) };
    let Some(eps) = eps.extract::<f64>().ok().filter(|e| e.is_finite() && *e >= 0.0) else { return Ok(None) };
    let call = WhitenArgs { x, mask, cu_seqlens, shift_mean, eps, out };
    by_plain_dtype!(call.x, whiten_typed(py, &call))
}

struct WhitenArgs<'py> {
    x: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    shift_mean: bool,
    eps: f64,
    out: Option<Bound<'py, PyAny>>,
}

fn whiten_typed<'py, F: FloatDtype>(py: Python<'py>, c: &WhitenArgs<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((out, mut o, reads)) = whiten_borrows::<F>(py, c) else { return Ok(None) };
    let MaskedSlices { x, m, cu, grid } = reads.slices();
    let os = o.as_slice_mut().expect("contiguous");
    let lay = layout(py, cu, grid, x.len())?;
    let (shift_mean, eps) = (c.shift_mean, c.eps);
    let result = match m {
        None => py.detach(|| crate::whiten::masked_whiten(&lay, x, AllValid, shift_mean, eps, os)),
        Some(m) => py.detach(|| crate::whiten::masked_whiten(&lay, x, m, shift_mean, eps, os)),
    };
    result.map_err(|e| to_pyerr(py, e))?;
    drop(o);
    Ok(Some(out.into_any()))
}

/// The output (to return, and borrowed) and the borrowed inputs of a whitening call;
/// None when any argument is not plain.
#[allow(clippy::type_complexity)]
fn whiten_borrows<'py, F: FloatDtype>(
    py: Python<'py>,
    c: &WhitenArgs<'py>,
) -> Option<(Bound<'py, PyArrayDyn<F>>, numpy::PyReadwriteArrayDyn<'py, F>, MaskedReads<'py, F>)> {
    let x = MaskedArray::<F>::plain(&c.x, &c.mask, &c.cu_seqlens)?;
    let out = match &c.out {
        None => {
            // Start waking the pool so that the wake-up overlaps the allocation.
            wake_pool_ahead(x.x.len(), x.lay.rows);
            // SAFETY: the kernel writes every position of its output.
            unsafe { PyArrayDyn::<F>::new(py, &x.shape[..], false) }
        }
        Some(o) if o.is(&c.x) => return None,
        Some(o) => plain::<F>(o, &x.shape)?.clone(),
    };
    if c.out.is_some() && any_overlap(&[bytes(&out)], &x.input_bytes()) {
        return None;
    }
    let o = out.try_readwrite().ok()?;
    let reads = x.read()?;
    if c.out.is_some() {
        wake_pool_ahead(x.x.len(), x.lay.rows);
    }
    Some((out, o, reads))
}

/// Group-relative advantages on the plain path: the `float64` advantages, or None
/// (see the module). Plain here means `float64` scores and `int64` ids, both 1-D and
/// C-contiguous, of one length.
#[pyfunction]
#[pyo3(signature = (scores, groups, method, eps, singleton))]
pub(super) fn group_advantages_plain<'py>(
    py: Python<'py>,
    scores: Bound<'py, PyAny>,
    groups: Bound<'py, PyAny>,
    method: Bound<'py, PyAny>,
    eps: Bound<'py, PyAny>,
    singleton: Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let method = method.extract::<&str>().ok().and_then(group_method);
    let singleton = singleton.extract::<&str>().ok().and_then(group_singleton);
    let eps = eps.extract::<f64>().ok().filter(|e| e.is_finite() && *e >= 0.0);
    let (Some(method), Some(singleton), Some(eps)) = (method, singleton, eps) else { return Ok(None) };
    let Some(s) = scores.cast::<PyArray1<f64>>().ok().filter(|s| readable(*s)) else { return Ok(None) };
    let n = s.len();
    let Some(g) = groups.cast::<PyArray1<i64>>().ok().filter(|g| readable(*g) && g.len() == n) else {
        return Ok(None);
    };
    // SAFETY: the kernel writes every position of its output.
    let out = unsafe { PyArray1::<f64>::new(py, n, false) };
    let (Ok(sr), Ok(gr), Ok(mut o)) = (s.try_readonly(), g.try_readonly(), out.try_readwrite()) else {
        return Ok(None);
    };
    let (ss, gs) = (sr.as_slice().expect("contiguous"), gr.as_slice().expect("contiguous"));
    let os = o.as_slice_mut().expect("contiguous");
    py.detach(|| crate::outcome::group_advantages(ss, gs, method, eps, singleton, os)).map_err(|e| to_pyerr(py, e))?;
    drop(o);
    Ok(Some(out.into_any()))
}
