//! Python bindings (feature `python`): convert arrays, validate, release the GIL, map
//! errors. No arithmetic lives here.
//!
//! The Python layer (`python/comppo_core/`) hands over flat, C-contiguous arrays of one
//! float dtype, allocates the outputs, and describes the layout either by
//! `cu_seqlens` (packed) or by `shape = (rows, cols)` (padded).

use crate::element::{AllValid, Float, UnitGates};
use crate::error::KernelError;
use crate::gae::GaeParams;
use crate::gating::{GateParams, Normalize};
use crate::layout::Layout;
use crate::pool;
use numpy::{Element, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

/// The package's Python exception class for each kernel error (one match, exhaustive),
/// with the error's structure as the exception's attributes (`comppo_core.errors`):
/// `argument`, the first offending `row` and `position`, and `index` (the flat index of
/// a packed location, or the entry of a 1-D argument).
fn to_pyerr(py: Python<'_>, e: KernelError) -> PyErr {
    let at = |arg: &'static str, loc: &crate::error::Loc| ErrorAttrs {
        argument: Some(arg),
        row: Some(loc.row),
        position: Some(loc.pos),
        index: loc.flat,
    };
    let (class, attrs) = match &e {
        KernelError::Shape { arg, .. } => ("ShapeError", ErrorAttrs::arg(arg)),
        KernelError::CuSeqlens { index, .. } => {
            ("LayoutError", ErrorAttrs { index: Some(*index), ..ErrorAttrs::arg("cu_seqlens") })
        }
        KernelError::NonFinite { arg, at: loc, .. } => ("NonFiniteError", at(arg, loc)),
        KernelError::NonFiniteIndex { arg, index, .. } => {
            ("NonFiniteError", ErrorAttrs { index: Some(*index), ..ErrorAttrs::arg(arg) })
        }
        KernelError::OutOfRange { arg, at: loc, .. } => ("OutOfRangeError", at(arg, loc)),
        KernelError::MaskedReward { at: loc, .. } => ("MaskedRewardError", at("rewards", loc)),
        KernelError::Parameter { arg, .. } => ("ParameterError", ErrorAttrs::arg(arg)),
        KernelError::RowValue { arg, row, .. } => ("ParameterError", ErrorAttrs { row: Some(*row), ..ErrorAttrs::arg(arg) }),
    };
    raise_with(py, class, e.to_string(), attrs)
}

/// The attributes of a `comppo_core.errors` exception, passed to its constructor as
/// keywords (those that are `None` are left out).
#[derive(Clone, Copy, Default)]
struct ErrorAttrs<'a> {
    argument: Option<&'a str>,
    row: Option<usize>,
    position: Option<usize>,
    index: Option<usize>,
}

impl<'a> ErrorAttrs<'a> {
    /// Only the argument's name.
    fn arg(name: &'a str) -> Self {
        ErrorAttrs { argument: Some(name), ..ErrorAttrs::default() }
    }
}

/// An instance of `comppo_core.errors.<class>` carrying `msg` and no attributes (see
/// [`raise_with`] to give them).
fn raise(py: Python<'_>, class: &str, msg: String) -> PyErr {
    raise_with(py, class, msg, ErrorAttrs::default())
}

/// An instance of `comppo_core.errors.<class>(msg, **attrs)`; a plain `ValueError(msg)`
/// if the package's class cannot be had (it always can once the package is imported).
fn raise_with(py: Python<'_>, class: &str, msg: String, attrs: ErrorAttrs<'_>) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let ty = py.import("comppo_core.errors")?.getattr(class)?.cast_into::<PyType>().map_err(PyErr::from)?;
        let kwargs = PyDict::new(py);
        if let Some(a) = attrs.argument {
            kwargs.set_item("argument", a)?;
        }
        for (key, value) in [("row", attrs.row), ("position", attrs.position), ("index", attrs.index)] {
            if let Some(v) = value {
                kwargs.set_item(key, v)?;
            }
        }
        Ok(PyErr::from_value(ty.call((msg.as_str(),), Some(&kwargs))?))
    })();
    built.unwrap_or_else(|_| PyValueError::new_err(msg))
}

#[derive(FromPyObject)]
enum Floats<'py> {
    F32(PyReadonlyArray1<'py, f32>),
    F64(PyReadonlyArray1<'py, f64>),
}

#[derive(FromPyObject)]
enum FloatsMut<'py> {
    F32(PyReadwriteArray1<'py, f32>),
    F64(PyReadwriteArray1<'py, f64>),
}

#[derive(FromPyObject)]
enum MaskArray<'py> {
    Bool(PyReadonlyArray1<'py, bool>),
    U8(PyReadonlyArray1<'py, u8>),
    I8(PyReadonlyArray1<'py, i8>),
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
    F32(PyReadonlyArray1<'py, f32>),
    F64(PyReadonlyArray1<'py, f64>),
}

/// The float dtypes the kernels take, with typed access to the dtype enums.
trait FloatDtype: Float + Element {
    const NAME: &'static str;
    fn of<'a, 'py>(a: &'a Floats<'py>) -> Option<&'a PyReadonlyArray1<'py, Self>>;
    fn of_mut<'a, 'py>(a: &'a mut FloatsMut<'py>) -> Option<&'a mut PyReadwriteArray1<'py, Self>>;
}

macro_rules! float_dtype {
    ($t:ty, $variant:ident, $name:literal) => {
        impl FloatDtype for $t {
            const NAME: &'static str = $name;
            fn of<'a, 'py>(a: &'a Floats<'py>) -> Option<&'a PyReadonlyArray1<'py, Self>> {
                match a {
                    Floats::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn of_mut<'a, 'py>(a: &'a mut FloatsMut<'py>) -> Option<&'a mut PyReadwriteArray1<'py, Self>> {
                match a {
                    FloatsMut::$variant(x) => Some(x),
                    _ => None,
                }
            }
        }
    };
}
float_dtype!(f32, F32, "float32");
float_dtype!(f64, F64, "float64");

fn dtype_name(a: &Floats<'_>) -> &'static str {
    match a {
        Floats::F32(_) => "float32",
        Floats::F64(_) => "float64",
    }
}

fn contiguous<'a, T: Element>(py: Python<'_>, arg: &str, a: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| raise(py, "ShapeError", format!("{arg}: expected a C-contiguous array")))
}

/// An optional contiguous 1-D argument as a slice.
fn optional<'a, T: Element>(
    py: Python<'_>,
    arg: &str,
    a: &'a Option<PyReadonlyArray1<'_, T>>,
) -> PyResult<Option<&'a [T]>> {
    a.as_ref().map(|a| contiguous(py, arg, a)).transpose()
}

/// Calls the generic `$f::<F>(args)` with `F` the float type of the array `$on`, a
/// `Floats` or, named first, another enum of the two dtypes (`by_dtype!(FloatsMut: x, ...)`).
macro_rules! by_dtype {
    ($enum:ident : $on:expr, $f:ident($($arg:expr),*)) => {
        match $on {
            $enum::F32(_) => $f::<f32>($($arg),*),
            $enum::F64(_) => $f::<f64>($($arg),*),
        }
    };
    ($on:expr, $f:ident($($arg:expr),*)) => {
        by_dtype!(Floats: $on, $f($($arg),*))
    };
}

fn typed<'a, F: FloatDtype>(py: Python<'_>, arg: &str, a: &'a Floats<'_>) -> PyResult<&'a [F]> {
    match F::of(a) {
        Some(x) => contiguous(py, arg, x),
        None => {
            Err(raise(py, "DTypeError", format!("{arg}: expected {} like rewards, got {}", F::NAME, dtype_name(a))))
        }
    }
}

fn typed_mut<'a, F: FloatDtype>(py: Python<'_>, arg: &str, a: &'a mut FloatsMut<'_>) -> PyResult<&'a mut [F]> {
    match F::of_mut(a) {
        Some(x) => {
            x.as_slice_mut().map_err(|_| raise(py, "ShapeError", format!("{arg}: expected a C-contiguous array")))
        }
        None => Err(raise(py, "DTypeError", format!("{arg}: expected {} like rewards", F::NAME))),
    }
}

fn layout<'a>(py: Python<'_>, cu_seqlens: Option<&'a [i64]>, shape: (usize, usize), n: usize) -> PyResult<Layout<'a>> {
    match cu_seqlens {
        Some(cu) => Layout::packed(cu, n),
        None => Layout::padded(shape.0, shape.1, n),
    }
    .map_err(|e| to_pyerr(py, e))
}

/// Runs `$body` with `$m` bound to the mask as a kernel `Mask` (one instantiation per
/// mask dtype).
macro_rules! with_mask {
    ($py:expr, $mask:expr, |$m:ident| $body:expr) => {
        match $mask {
            None => {
                let $m = AllValid;
                $body
            }
            Some(MaskArray::Bool(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
            Some(MaskArray::U8(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
            Some(MaskArray::I8(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
            Some(MaskArray::I32(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
            Some(MaskArray::I64(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
            Some(MaskArray::F32(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
            Some(MaskArray::F64(a)) => {
                let $m = contiguous($py, "mask", a)?;
                $body
            }
        }
    };
}

/// Runs `$body` with `$g` bound to the gates (unit gates when absent).
macro_rules! with_gates {
    ($gates:expr, |$g:ident| $body:expr) => {
        match $gates {
            None => {
                let $g = UnitGates;
                $body
            }
            Some(s) => {
                let $g = s;
                $body
            }
        }
    };
}

// After the macros above, which it uses.
mod plain;

struct GaeCall<'a, 'py> {
    rewards: Floats<'py>,
    values: Floats<'py>,
    advantages: FloatsMut<'py>,
    returns: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    gates: Option<Floats<'py>>,
    cu_seqlens: Option<&'a [i64]>,
    shape: (usize, usize),
    last_values: Option<&'a [f64]>,
    params: GaeParams,
}

fn gae_typed<F: FloatDtype>(py: Python<'_>, mut c: GaeCall<'_, '_>) -> PyResult<()> {
    let r = typed::<F>(py, "rewards", &c.rewards)?;
    let v = typed::<F>(py, "values", &c.values)?;
    let g = match &c.gates {
        Some(g) => Some(typed::<F>(py, "gates", g)?),
        None => None,
    };
    let adv = typed_mut::<F>(py, "advantages (out)", &mut c.advantages)?;
    let ret = typed_mut::<F>(py, "returns (out)", &mut c.returns)?;
    let lay = layout(py, c.cu_seqlens, c.shape, r.len())?;
    let (lv, p) = (c.last_values, c.params);
    let result = with_mask!(py, &c.mask, |m| with_gates!(g, |g| py
        .detach(|| crate::gae::gae(&lay, r, v, m, g, lv, &p, adv, ret))));
    result.map_err(|e| to_pyerr(py, e))
}

/// Comp-GAE into preallocated `advantages` and `returns` (flat, C-contiguous).
#[pyfunction]
#[pyo3(signature = (rewards, values, advantages, returns, *, mask, gates, cu_seqlens, shape, gamma, lam, lam_critic, last_values, drop_masked_rewards))]
#[allow(clippy::too_many_arguments)]
fn gae<'py>(
    py: Python<'py>,
    rewards: Floats<'py>,
    values: Floats<'py>,
    advantages: FloatsMut<'py>,
    returns: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    gates: Option<Floats<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
    gamma: f64,
    lam: f64,
    lam_critic: f64,
    last_values: Option<PyReadonlyArray1<'py, f64>>,
    drop_masked_rewards: bool,
) -> PyResult<()> {
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    let lv = optional(py, "last_values", &last_values)?;
    let params = GaeParams { gamma, lam, lam_critic, drop_masked_rewards };
    let is_f32 = matches!(rewards, Floats::F32(_));
    let call =
        GaeCall { rewards, values, advantages, returns, mask, gates, cu_seqlens: cu, shape, last_values: lv, params };
    if is_f32 {
        gae_typed::<f32>(py, call)
    } else {
        gae_typed::<f64>(py, call)
    }
}

#[allow(clippy::too_many_arguments)]
fn td_typed<F: FloatDtype>(
    py: Python<'_>,
    rewards: &Floats<'_>,
    values: &Floats<'_>,
    out: &mut FloatsMut<'_>,
    mask: &Option<MaskArray<'_>>,
    gates: &Option<Floats<'_>>,
    cu: Option<&[i64]>,
    shape: (usize, usize),
    gamma: f64,
    lv: Option<&[f64]>,
) -> PyResult<()> {
    let r = typed::<F>(py, "rewards", rewards)?;
    let v = typed::<F>(py, "values", values)?;
    let g = match gates {
        Some(g) => Some(typed::<F>(py, "gates", g)?),
        None => None,
    };
    let out = typed_mut::<F>(py, "out", out)?;
    let lay = layout(py, cu, shape, r.len())?;
    let result = with_mask!(py, mask, |m| with_gates!(g, |g| py
        .detach(|| crate::td::td_targets(&lay, r, v, m, g, lv, gamma, out))));
    result.map_err(|e| to_pyerr(py, e))
}

/// One-step gated TD targets into a preallocated `out`.
#[pyfunction]
#[pyo3(signature = (rewards, values, out, *, mask, gates, cu_seqlens, shape, gamma, last_values))]
#[allow(clippy::too_many_arguments)]
fn td_targets<'py>(
    py: Python<'py>,
    rewards: Floats<'py>,
    values: Floats<'py>,
    mut out: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    gates: Option<Floats<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
    gamma: f64,
    last_values: Option<PyReadonlyArray1<'py, f64>>,
) -> PyResult<()> {
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    let lv = optional(py, "last_values", &last_values)?;
    by_dtype!(rewards, td_typed(py, &rewards, &values, &mut out, &mask, &gates, cu, shape, gamma, lv))
}

fn gates_typed<F: FloatDtype>(
    py: Python<'_>,
    conc: &Floats<'_>,
    out: &mut FloatsMut<'_>,
    mask: &Option<MaskArray<'_>>,
    cu: Option<&[i64]>,
    shape: (usize, usize),
    params: &GateParams,
) -> PyResult<()> {
    let c = typed::<F>(py, "concentration", conc)?;
    let out = typed_mut::<F>(py, "out", out)?;
    let lay = layout(py, cu, shape, c.len())?;
    let result =
        with_mask!(py, mask, |m| py.detach(|| crate::gating::gates_from_concentration(&lay, c, m, params, out)));
    result.map_err(|e| to_pyerr(py, e))
}

/// Retention gates from concentration into a preallocated `out`.
#[pyfunction]
#[pyo3(signature = (concentration, out, *, mask, cu_seqlens, shape, low, high, sharpness, normalize, center, scale, invert))]
#[allow(clippy::too_many_arguments)]
fn gates_from_concentration<'py>(
    py: Python<'py>,
    concentration: Floats<'py>,
    mut out: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
    low: f64,
    high: f64,
    sharpness: f64,
    normalize: &str,
    center: f64,
    scale: f64,
    invert: bool,
) -> PyResult<()> {
    let normalize = match normalize {
        "sequence" => Normalize::Sequence,
        "batch" => Normalize::Batch,
        "none" => Normalize::Fixed { center, scale },
        other => {
            return Err(raise(
                py,
                "ParameterError",
                format!("normalize: expected one of 'sequence', 'batch', 'none', got {other:?}"),
            ))
        }
    };
    let params = GateParams { low, high, sharpness, normalize, invert };
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    by_dtype!(concentration, gates_typed(py, &concentration, &mut out, &mask, cu, shape, &params))
}

/// The `method` argument of `group_advantages`.
fn group_method(method: &str) -> Option<crate::outcome::Method> {
    use crate::outcome::Method;
    Some(match method {
        "grpo" => Method::Grpo,
        "drgrpo" => Method::DrGrpo,
        "rloo" => Method::Rloo,
        "reinforce_baseline" => Method::ReinforceBaseline,
        _ => return None,
    })
}

/// The `singleton` argument of `group_advantages`.
fn group_singleton(singleton: &str) -> Option<crate::outcome::Singleton> {
    use crate::outcome::Singleton;
    Some(match singleton {
        "zero" => Singleton::Zero,
        "raw" => Singleton::Raw,
        _ => return None,
    })
}

/// Group-relative outcome advantages into a preallocated float64 `out`.
#[pyfunction]
#[pyo3(signature = (scores, groups, out, *, method, eps, singleton))]
fn group_advantages<'py>(
    py: Python<'py>,
    scores: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    mut out: PyReadwriteArray1<'py, f64>,
    method: &str,
    eps: f64,
    singleton: &str,
) -> PyResult<()> {
    let Some(method) = group_method(method) else {
        return Err(raise(
            py,
            "ParameterError",
            format!("method: expected one of 'grpo', 'drgrpo', 'rloo', 'reinforce_baseline', got {method:?}"),
        ));
    };
    let Some(singleton) = group_singleton(singleton) else {
        return Err(raise(
            py,
            "ParameterError",
            format!("singleton: expected one of 'zero', 'raw', got {singleton:?}"),
        ));
    };
    let s = contiguous(py, "scores", &scores)?;
    let g = contiguous(py, "groups", &groups)?;
    let o = out.as_slice_mut().map_err(|_| raise(py, "ShapeError", "out: expected a C-contiguous array".into()))?;
    py.detach(|| crate::outcome::group_advantages(s, g, method, eps, singleton, o)).map_err(|e| to_pyerr(py, e))
}

fn broadcast_typed<F: FloatDtype>(
    py: Python<'_>,
    per_row: &Floats<'_>,
    out: &mut FloatsMut<'_>,
    mask: &Option<MaskArray<'_>>,
    cu: Option<&[i64]>,
    shape: (usize, usize),
) -> PyResult<()> {
    let a = typed::<F>(py, "per_sequence", per_row)?;
    let out = typed_mut::<F>(py, "out", out)?;
    let lay = layout(py, cu, shape, out.len())?;
    let result = with_mask!(py, mask, |m| py.detach(|| crate::broadcast::broadcast(&lay, a, m, out)));
    result.map_err(|e| to_pyerr(py, e))
}

/// Per-sequence values broadcast to tokens into a preallocated `out`.
#[pyfunction]
#[pyo3(signature = (per_sequence, out, *, mask, cu_seqlens, shape))]
fn broadcast<'py>(
    py: Python<'py>,
    per_sequence: Floats<'py>,
    mut out: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
) -> PyResult<()> {
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    by_dtype!(per_sequence, broadcast_typed(py, &per_sequence, &mut out, &mask, cu, shape))
}

#[allow(clippy::too_many_arguments)]
fn whiten_typed<F: FloatDtype>(
    py: Python<'_>,
    x: &Floats<'_>,
    out: &mut FloatsMut<'_>,
    mask: &Option<MaskArray<'_>>,
    cu: Option<&[i64]>,
    shape: (usize, usize),
    shift_mean: bool,
    eps: f64,
) -> PyResult<()> {
    let x = typed::<F>(py, "x", x)?;
    let out = typed_mut::<F>(py, "out", out)?;
    let lay = layout(py, cu, shape, x.len())?;
    let result = with_mask!(py, mask, |m| py.detach(|| crate::whiten::masked_whiten(&lay, x, m, shift_mean, eps, out)));
    result.map_err(|e| to_pyerr(py, e))
}

/// Masked whitening into a preallocated `out`.
#[pyfunction]
#[pyo3(signature = (x, out, *, mask, cu_seqlens, shape, shift_mean, eps))]
#[allow(clippy::too_many_arguments)]
fn masked_whiten<'py>(
    py: Python<'py>,
    x: Floats<'py>,
    mut out: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
    shift_mean: bool,
    eps: f64,
) -> PyResult<()> {
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    by_dtype!(x, whiten_typed(py, &x, &mut out, &mask, cu, shape, shift_mean, eps))
}

fn whiten_in_place_typed<F: FloatDtype>(
    py: Python<'_>,
    x: &mut FloatsMut<'_>,
    mask: &Option<MaskArray<'_>>,
    cu: Option<&[i64]>,
    shape: (usize, usize),
    shift_mean: bool,
    eps: f64,
) -> PyResult<()> {
    let x = typed_mut::<F>(py, "x", x)?;
    let lay = layout(py, cu, shape, x.len())?;
    let result = with_mask!(py, mask, |m| py
        .detach(|| crate::whiten::masked_whiten_in_place(&lay, &mut *x, m, shift_mean, eps)));
    result.map_err(|e| to_pyerr(py, e))
}

/// Masked whitening overwriting `x`.
#[pyfunction]
#[pyo3(signature = (x, *, mask, cu_seqlens, shape, shift_mean, eps))]
fn masked_whiten_in_place<'py>(
    py: Python<'py>,
    mut x: FloatsMut<'py>,
    mask: Option<MaskArray<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
    shift_mean: bool,
    eps: f64,
) -> PyResult<()> {
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    by_dtype!(FloatsMut: x, whiten_in_place_typed(py, &mut x, &mask, cu, shape, shift_mean, eps))
}

fn stats_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    x: &Floats<'_>,
    mask: &Option<MaskArray<'_>>,
    cu: Option<&[i64]>,
    shape: (usize, usize),
) -> PyResult<Bound<'py, PyDict>> {
    let x = typed::<F>(py, "x", x)?;
    let lay = layout(py, cu, shape, x.len())?;
    let s =
        with_mask!(py, mask, |m| py.detach(|| crate::stats::credit_stats(&lay, x, m))).map_err(|e| to_pyerr(py, e))?;
    let d = PyDict::new(py);
    d.set_item("mean", s.mean)?;
    d.set_item("std", s.std)?;
    d.set_item("min", s.min)?;
    d.set_item("max", s.max)?;
    d.set_item("frac_positive", s.frac_positive)?;
    d.set_item("gini", s.gini)?;
    d.set_item("effective_token_ratio", s.effective_token_ratio)?;
    Ok(d)
}

/// Credit diagnostics of a per-token array over its valid tokens, as a dict.
#[pyfunction]
#[pyo3(signature = (x, *, mask, cu_seqlens, shape))]
fn credit_stats<'py>(
    py: Python<'py>,
    x: Floats<'py>,
    mask: Option<MaskArray<'py>>,
    cu_seqlens: Option<PyReadonlyArray1<'py, i64>>,
    shape: (usize, usize),
) -> PyResult<Bound<'py, PyDict>> {
    let cu = optional(py, "cu_seqlens", &cu_seqlens)?;
    by_dtype!(x, stats_typed(py, &x, &mask, cu, shape))
}

/// Sets the number of threads the kernels use (>= 1).
#[pyfunction]
fn set_num_threads(py: Python<'_>, n: i64) -> PyResult<()> {
    if n < 1 {
        return Err(raise(py, "ParameterError", format!("n: expected an integer >= 1, got {n}")));
    }
    pool::set_num_threads(n as usize);
    Ok(())
}

/// The number of threads the kernels use.
#[pyfunction]
fn get_num_threads() -> usize {
    pool::num_threads()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gae, m)?)?;
    m.add_function(wrap_pyfunction!(plain::gae_plain, m)?)?;
    m.add_function(wrap_pyfunction!(plain::td_targets_plain, m)?)?;
    m.add_function(wrap_pyfunction!(plain::gates_from_concentration_plain, m)?)?;
    m.add_function(wrap_pyfunction!(plain::masked_whiten_plain, m)?)?;
    m.add_function(wrap_pyfunction!(plain::group_advantages_plain, m)?)?;
    m.add_function(wrap_pyfunction!(td_targets, m)?)?;
    m.add_function(wrap_pyfunction!(gates_from_concentration, m)?)?;
    m.add_function(wrap_pyfunction!(group_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(masked_whiten, m)?)?;
    m.add_function(wrap_pyfunction!(masked_whiten_in_place, m)?)?;
    m.add_function(wrap_pyfunction!(credit_stats, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add("NUM_THREADS_ENV", pool::ENV_VAR)?;
    Ok(())
}
