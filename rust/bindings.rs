//! Python bindings (feature `python`): one entry per public function of the package. An
//! entry checks its arguments, allocates the outputs, releases the GIL for the kernel
//! and maps errors; no arithmetic lives here.
//!
//! Each entry takes its arguments in *canonical form*: NumPy arrays as the kernels read
//! them (native float32 or float64, every float array of the call of one dtype; a bool
//! mask; int64 `cu_seqlens`; float64 `last_values` and scores; int64 group ids; each
//! C-contiguous, aligned and shaped as the layout says: `[B, T]` without `cu_seqlens`,
//! `[N]` with them), scalars of the right kind and range, and `out` None or arrays of the
//! result's dtype and shape, writeable and apart from every input and each other. Given
//! those it returns the result, in `out` or in fresh arrays (their memory from
//! [`crate::buffers`] when large). Given anything else it returns None having touched
//! and allocated nothing, and the Python layer (`python/comppo_core/`) puts the
//! arguments in canonical form (tensors, other dtypes, strides, int or float masks,
//! int32 offsets) or raises the error that names the first bad one, then calls the same
//! entry again. So a NumPy call already in canonical form costs one call into Rust and
//! nothing else; the kernels' own errors (NaN, ranges, masked rewards, `cu_seqlens`
//! values) come from here whichever way the call came.
//!
//! Why the Python layer does not check first: right after a large batch has streamed
//! through the CPU's caches, as in a training loop, every Python operation misses them
//! (on W2, 64 × 16384, the few hundred operations of the conversions took ~140 µs of a
//! ~850 µs call); these checks take ~10 µs.

use crate::buffers;
use crate::element::{AllValid, UnitGates};
use crate::error::KernelError;
use crate::gae::GaeParams;
use crate::gating::{GateParams, Normalize};
use crate::layout::Layout;
use crate::pool;
use numpy::npyffi::{self, NpyTypes, PY_ARRAY_API};
use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyReadwriteArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple, PyType};
use std::ops::Range;

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
        KernelError::RowValue { arg, row, .. } => {
            ("ParameterError", ErrorAttrs { row: Some(*row), ..ErrorAttrs::arg(arg) })
        }
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

/// The float dtypes the kernels take.
trait FloatDtype: crate::element::Float + Element {}
impl FloatDtype for f32 {}
impl FloatDtype for f64 {}

/// `$f::<f32>(args)` or `$f::<f64>(args)` by the dtype of the array `$on`; `Ok(None)`
/// (not canonical) for anything else.
macro_rules! by_dtype {
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

/// Runs `$body` with `$m` bound to the mask (every position valid when there is none).
macro_rules! with_mask {
    ($mask:expr, |$m:ident| $body:expr) => {
        match $mask {
            None => {
                let $m = AllValid;
                $body
            }
            Some($m) => $body,
        }
    };
}

/// Runs `$body` with `$g` bound to the gates (unit gates when there are none).
macro_rules! with_gates {
    ($gates:expr, |$g:ident| $body:expr) => {
        match $gates {
            None => {
                let $g = UnitGates;
                $body
            }
            Some($g) => $body,
        }
    };
}

// ---------------------------------------------------------------- canonical arguments

/// `a` as an array of `T` the kernels can read as a slice (C-contiguous and aligned: a
/// view into a byte buffer at an odd offset is contiguous but not aligned), with
/// exactly `shape` when one is given; else None.
fn array<'a, 'py, T: Element>(
    a: &'a Bound<'py, PyAny>,
    shape: Option<&[usize]>,
) -> Option<&'a Bound<'py, PyArrayDyn<T>>> {
    let a = a.cast::<PyArrayDyn<T>>().ok()?;
    (a.is_c_contiguous() && a.is_aligned() && shape.is_none_or(|s| a.shape() == s)).then_some(a)
}

/// A 1-D [`array`] of any length.
fn vector<'a, 'py, T: Element>(a: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, PyArrayDyn<T>>> {
    array::<T>(a, None).filter(|a| a.ndim() == 1)
}

/// An optional argument: `Some(None)` when absent, `Some(Some(array))` when canonical
/// with `shape`, None when present but not canonical.
#[allow(clippy::option_option)]
fn optional<'a, 'py, T: Element>(
    a: &'a Option<Bound<'py, PyAny>>,
    shape: &[usize],
) -> Option<Option<&'a Bound<'py, PyArrayDyn<T>>>> {
    match a {
        None => Some(None),
        Some(a) => array::<T>(a, Some(shape)).map(Some),
    }
}

fn writeable<'py>(a: &impl PyUntypedArrayMethods<'py>) -> bool {
    // SAFETY: reads the flags of a live array, the GIL held.
    unsafe { (*npyffi::_PyArray_GET_ITEM_DATA(a.as_array_ptr())).flags & npyffi::NPY_ARRAY_WRITEABLE != 0 }
}

/// The bytes an array's data occupies (the arrays here are C-contiguous).
fn bytes<T: Element>(a: &Bound<'_, PyArrayDyn<T>>) -> Range<usize> {
    let start = a.data() as usize;
    start..start + a.len() * std::mem::size_of::<T>()
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// A scalar argument as a float in [0, 1], or None.
fn unit(x: &Bound<'_, PyAny>) -> Option<f64> {
    x.extract::<f64>().ok().filter(|v| (0.0..=1.0).contains(v))
}

/// A scalar argument as a finite float, or None.
fn finite(x: &Bound<'_, PyAny>) -> Option<f64> {
    x.extract::<f64>().ok().filter(|v| v.is_finite())
}

/// A scalar argument that is a Python `bool`, or None.
fn boolean(x: &Bound<'_, PyAny>) -> Option<bool> {
    x.cast::<PyBool>().ok().map(|b| b.is_true())
}

/// The layout of a call whose first array has `shape`: padded (`[B, T]`, no
/// `cu_seqlens`) or packed (`[N]` and int64 `cu_seqlens`); None for anything else.
struct Grid<'a, 'py> {
    shape: Vec<usize>,
    /// B (packed: one less than the offsets, 0 for none; `Layout::packed` names that).
    rows: usize,
    cu: Option<&'a Bound<'py, PyArrayDyn<i64>>>,
}

impl<'a, 'py> Grid<'a, 'py> {
    fn of(shape: &[usize], cu_seqlens: &'a Option<Bound<'py, PyAny>>) -> Option<Self> {
        match (cu_seqlens, shape) {
            (None, &[rows, _]) => Some(Grid { shape: shape.to_vec(), rows, cu: None }),
            (Some(cu), &[_]) => {
                let cu = vector::<i64>(cu)?;
                Some(Grid { shape: shape.to_vec(), rows: cu.len().saturating_sub(1), cu: Some(cu) })
            }
            _ => None,
        }
    }

    fn bytes(&self) -> Option<Range<usize>> {
        self.cu.map(bytes)
    }
}

/// The validated kernel layout of `grid` over `n` positions (packed: `cu` its offsets).
fn layout<'a>(py: Python<'_>, grid: &Grid<'_, '_>, cu: Option<&'a [i64]>, n: usize) -> PyResult<Layout<'a>> {
    match (cu, &grid.shape[..]) {
        (Some(cu), _) => Layout::packed(cu, n),
        (None, &[rows, cols]) => Layout::padded(rows, cols, n),
        (None, _) => unreachable!("a padded grid is 2-D"),
    }
    .map_err(|e| to_pyerr(py, e))
}

// ---------------------------------------------------------------- borrows

/// The error for an array another thread's call is writing into right now (the only way
/// a borrow of a canonical argument can fail).
fn in_use(py: Python<'_>, arg: &str) -> PyErr {
    raise_with(
        py,
        "ShapeError",
        format!("{arg}: expected an array no running call writes to, got one another thread's call is writing"),
        ErrorAttrs::arg(arg),
    )
}

fn read<'py, T: Element>(
    py: Python<'_>,
    arg: &str,
    a: &Bound<'py, PyArrayDyn<T>>,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    a.try_readonly().map_err(|_| in_use(py, arg))
}

fn read_opt<'py, T: Element>(
    py: Python<'_>,
    arg: &str,
    a: Option<&Bound<'py, PyArrayDyn<T>>>,
) -> PyResult<Option<PyReadonlyArrayDyn<'py, T>>> {
    a.map(|a| read(py, arg, a)).transpose()
}

fn write<'py, T: Element>(
    py: Python<'_>,
    arg: &str,
    a: &Bound<'py, PyArrayDyn<T>>,
) -> PyResult<PyReadwriteArrayDyn<'py, T>> {
    a.try_readwrite().map_err(|_| in_use(py, arg))
}

/// The data of a borrowed canonical array.
fn slice<'a, T: Element>(a: &'a PyReadonlyArrayDyn<'_, T>) -> &'a [T] {
    a.as_slice().expect("canonical arrays are C-contiguous")
}

fn slice_mut<'a, T: Element>(a: &'a mut PyReadwriteArrayDyn<'_, T>) -> &'a mut [T] {
    a.as_slice_mut().expect("canonical arrays are C-contiguous")
}

// ---------------------------------------------------------------- outputs

/// The memory of an output array leased from [`crate::buffers`], as the array's base
/// object: freeing the array frees this, which gives the memory back to the cache.
#[pyclass(frozen, module = "comppo_core._core")]
struct Buffer {
    _lease: buffers::Lease,
}

/// A fresh, writeable, C-contiguous array of `shape`, its memory leased from
/// [`crate::buffers`] when large, else NumPy's. Uninitialised: the kernels write every
/// position of their outputs.
fn new_output<'py, F: FloatDtype>(py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyArrayDyn<F>>> {
    let mut dims: Vec<npyffi::npy_intp> = shape.iter().map(|&d| d as npyffi::npy_intp).collect();
    let elems = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let lease = elems.and_then(|n| n.checked_mul(std::mem::size_of::<F>())).and_then(buffers::lease);
    let data = lease.as_ref().map_or(std::ptr::null_mut(), buffers::Lease::as_ptr);
    let base = lease.map(|lease| Bound::new(py, Buffer { _lease: lease })).transpose()?;
    // SAFETY: a new array of `F` with `dims`; NumPy allocates its data when `data` is
    // null, else it views `data` (a leased block of at least its size, aligned to 4096
    // bytes), which stays valid while `base`, set as the array's base below, lives.
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            F::get_dtype(py).into_dtype_ptr(),
            dims.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data.cast(),
            if data.is_null() { 0 } else { npyffi::NPY_ARRAY_WRITEABLE },
            std::ptr::null_mut(),
        );
        let array = Bound::from_owned_ptr_or_err(py, ptr)?;
        if let Some(base) = base {
            // Steals the reference to `base`, also on failure.
            if PY_ARRAY_API.PyArray_SetBaseObject(py, ptr.cast(), base.into_ptr()) < 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(array.cast_into_unchecked())
    }
}

/// The `out` argument of a call: none (fresh outputs) or the caller's arrays.
enum Out<'py> {
    Fresh,
    Given(Vec<Bound<'py, PyAny>>),
}

impl<'py> Out<'py> {
    /// `out` as a tuple of `count` arrays (`gae`), or None when it is something else.
    fn tuple(out: &Option<Bound<'py, PyAny>>, count: usize) -> Option<Self> {
        match out {
            None => Some(Out::Fresh),
            Some(out) => {
                let out = out.cast::<PyTuple>().ok().filter(|t| t.len() == count)?;
                Some(Out::Given(out.iter().collect()))
            }
        }
    }

    /// Whether the outputs are canonical for results of dtype `F` and `shape` of a call
    /// whose inputs occupy `inputs`: fresh, or writeable arrays apart from the inputs and
    /// from each other.
    fn canonical<F: FloatDtype>(&self, shape: &[usize], inputs: &[Range<usize>]) -> bool {
        let Out::Given(outs) = self else { return true };
        let mut taken = inputs.to_vec();
        for o in outs {
            let Some(o) = array::<F>(o, Some(shape)).filter(|o| writeable(*o)) else { return false };
            let b = bytes(o);
            if taken.iter().any(|t| overlap(t, &b)) {
                return false;
            }
            taken.push(b);
        }
        true
    }

    /// The output arrays: the caller's (after [`Out::canonical`]) or `count` fresh ones.
    fn arrays<F: FloatDtype>(
        &self,
        py: Python<'py>,
        shape: &[usize],
        count: usize,
    ) -> PyResult<Vec<Bound<'py, PyArrayDyn<F>>>> {
        match self {
            Out::Fresh => (0..count).map(|_| new_output::<F>(py, shape)).collect(),
            Out::Given(outs) => {
                Ok(outs.iter().map(|o| o.cast::<PyArrayDyn<F>>().expect("checked canonical").clone()).collect())
            }
        }
    }
}

// ---------------------------------------------------------------- gae, td_targets

/// The array arguments of a call on a sequence batch (`gae`, `td_targets`).
struct SeqArgs<'py> {
    rewards: Bound<'py, PyAny>,
    values: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    gates: Option<Bound<'py, PyAny>>,
    last_values: Option<Bound<'py, PyAny>>,
}

/// [`SeqArgs`] checked canonical for float dtype `F`.
struct Seq<'a, 'py, F: FloatDtype> {
    r: &'a Bound<'py, PyArrayDyn<F>>,
    v: &'a Bound<'py, PyArrayDyn<F>>,
    g: Option<&'a Bound<'py, PyArrayDyn<F>>>,
    m: Option<&'a Bound<'py, PyArrayDyn<bool>>>,
    lv: Option<&'a Bound<'py, PyArrayDyn<f64>>>,
    grid: Grid<'a, 'py>,
}

/// [`Seq`] borrowed for reading.
struct SeqReads<'py, F: FloatDtype> {
    r: PyReadonlyArrayDyn<'py, F>,
    v: PyReadonlyArrayDyn<'py, F>,
    g: Option<PyReadonlyArrayDyn<'py, F>>,
    m: Option<PyReadonlyArrayDyn<'py, bool>>,
    lv: Option<PyReadonlyArrayDyn<'py, f64>>,
    cu: Option<PyReadonlyArrayDyn<'py, i64>>,
}

impl<'a, 'py, F: FloatDtype> Seq<'a, 'py, F> {
    fn canonical(c: &'a SeqArgs<'py>) -> Option<Self> {
        let r = array::<F>(&c.rewards, None)?;
        let grid = Grid::of(r.shape(), &c.cu_seqlens)?;
        let v = array::<F>(&c.values, Some(&grid.shape))?;
        let g = optional::<F>(&c.gates, &grid.shape)?;
        let m = optional::<bool>(&c.mask, &grid.shape)?;
        let lv = optional::<f64>(&c.last_values, &[grid.rows])?;
        Some(Seq { r, v, g, m, lv, grid })
    }

    fn input_bytes(&self) -> Vec<Range<usize>> {
        let mut inputs = vec![bytes(self.r), bytes(self.v)];
        inputs.extend(
            self.g.map(bytes).into_iter().chain(self.m.map(bytes)).chain(self.lv.map(bytes)).chain(self.grid.bytes()),
        );
        inputs
    }

    fn read(&self, py: Python<'_>) -> PyResult<SeqReads<'py, F>> {
        Ok(SeqReads {
            r: read(py, "rewards", self.r)?,
            v: read(py, "values", self.v)?,
            g: read_opt(py, "gates", self.g)?,
            m: read_opt(py, "mask", self.m)?,
            lv: read_opt(py, "last_values", self.lv)?,
            cu: read_opt(py, "cu_seqlens", self.grid.cu)?,
        })
    }
}

/// Comp-GAE: `(advantages, returns)`, in `out` when given, or None when an argument is
/// not canonical (see the module).
#[pyfunction]
#[pyo3(signature = (rewards, values, mask, cu_seqlens, gates, last_values, out, gamma, lam, lam_critic, masked_rewards))]
#[allow(clippy::too_many_arguments)]
fn gae<'py>(
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
    let (Some(gamma), Some(lam)) = (unit(&gamma), unit(&lam)) else { return Ok(None) };
    let lam_critic = match &lam_critic {
        None => lam,
        Some(l) => match unit(l) {
            Some(l) => l,
            None => return Ok(None),
        },
    };
    let drop_masked_rewards = match masked_rewards.extract::<&str>() {
        Ok("error") => false,
        Ok("drop") => true,
        _ => return Ok(None),
    };
    let Some(out) = Out::tuple(&out, 2) else { return Ok(None) };
    let params = GaeParams { gamma, lam, lam_critic, drop_masked_rewards };
    let args = SeqArgs { rewards, values, mask, cu_seqlens, gates, last_values };
    by_dtype!(args.rewards, gae_typed(py, &args, &out, &params))
}

fn gae_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    c: &SeqArgs<'py>,
    out: &Out<'py>,
    p: &GaeParams,
) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let Some(s) = Seq::<F>::canonical(c) else { return Ok(None) };
    if !out.canonical::<F>(&s.grid.shape, &s.input_bytes()) {
        return Ok(None);
    }
    let reads = s.read(py)?;
    let (r, v) = (slice(&reads.r), slice(&reads.v));
    let (g, m, lv) = (reads.g.as_ref().map(slice), reads.m.as_ref().map(slice), reads.lv.as_ref().map(slice));
    let lay = layout(py, &s.grid, reads.cu.as_ref().map(slice), r.len())?;
    let outs = out.arrays::<F>(py, &s.grid.shape, 2)?;
    let (mut adv, mut ret) = (write(py, "out (advantages)", &outs[0])?, write(py, "out (returns)", &outs[1])?);
    let (a, rt) = (slice_mut(&mut adv), slice_mut(&mut ret));
    let result = with_mask!(m, |m| with_gates!(g, |g| py.detach(|| crate::gae::gae(&lay, r, v, m, g, lv, p, a, rt))));
    result.map_err(|e| to_pyerr(py, e))?;
    drop((adv, ret));
    let mut outs = outs.into_iter().map(Bound::into_any);
    Ok(Some((outs.next().expect("two outputs"), outs.next().expect("two outputs"))))
}

/// One-step gated TD targets, or None when an argument is not canonical.
#[pyfunction]
#[pyo3(signature = (rewards, values, mask, cu_seqlens, gates, last_values, gamma))]
#[allow(clippy::too_many_arguments)]
fn td_targets<'py>(
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
    let args = SeqArgs { rewards, values, mask, cu_seqlens, gates, last_values };
    by_dtype!(args.rewards, td_typed(py, &args, gamma))
}

fn td_typed<'py, F: FloatDtype>(py: Python<'py>, c: &SeqArgs<'py>, gamma: f64) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(s) = Seq::<F>::canonical(c) else { return Ok(None) };
    let reads = s.read(py)?;
    let (r, v) = (slice(&reads.r), slice(&reads.v));
    let (g, m, lv) = (reads.g.as_ref().map(slice), reads.m.as_ref().map(slice), reads.lv.as_ref().map(slice));
    let lay = layout(py, &s.grid, reads.cu.as_ref().map(slice), r.len())?;
    let out = new_output::<F>(py, &s.grid.shape)?;
    let mut w = write(py, "out", &out)?;
    let o = slice_mut(&mut w);
    let result =
        with_mask!(m, |m| with_gates!(g, |g| py.detach(|| crate::td::td_targets(&lay, r, v, m, g, lv, gamma, o))));
    result.map_err(|e| to_pyerr(py, e))?;
    drop(w);
    Ok(Some(out.into_any()))
}

// ---------------------------------------------------------------- one array of tokens

/// One float array of tokens with its layout and optional bool mask, checked canonical
/// (`gates_from_concentration`, `masked_whiten`, `credit_stats`).
struct Tokens<'a, 'py, F: FloatDtype> {
    x: &'a Bound<'py, PyArrayDyn<F>>,
    m: Option<&'a Bound<'py, PyArrayDyn<bool>>>,
    grid: Grid<'a, 'py>,
}

impl<'a, 'py, F: FloatDtype> Tokens<'a, 'py, F> {
    fn canonical(
        x: &'a Bound<'py, PyAny>,
        mask: &'a Option<Bound<'py, PyAny>>,
        cu_seqlens: &'a Option<Bound<'py, PyAny>>,
    ) -> Option<Self> {
        let x = array::<F>(x, None)?;
        let grid = Grid::of(x.shape(), cu_seqlens)?;
        let m = optional::<bool>(mask, &grid.shape)?;
        Some(Tokens { x, m, grid })
    }

    /// The bytes of the mask and the offsets (the data's own are `bytes(self.x)`).
    fn layout_bytes(&self) -> Vec<Range<usize>> {
        self.m.map(bytes).into_iter().chain(self.grid.bytes()).collect()
    }

    /// The mask and the offsets, borrowed for reading.
    #[allow(clippy::type_complexity)]
    fn read_layout(
        &self,
        py: Python<'_>,
    ) -> PyResult<(Option<PyReadonlyArrayDyn<'py, bool>>, Option<PyReadonlyArrayDyn<'py, i64>>)> {
        Ok((read_opt(py, "mask", self.m)?, read_opt(py, "cu_seqlens", self.grid.cu)?))
    }
}

/// Retention gates from concentration, or None when an argument is not canonical
/// (finite float parameters, a known `normalize` and a `bool` `invert` included; the
/// kernel checks their ranges). `min_spread` (the z-score's floor on σ) may be left out:
/// 0, no floor.
#[pyfunction]
#[pyo3(signature = (conc, mask, cu_seqlens, low, high, sharpness, normalize, center, scale, invert, min_spread=None))]
#[allow(clippy::too_many_arguments)]
fn gates_from_concentration<'py>(
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
    min_spread: Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (Some(low), Some(high), Some(sharpness), Some(center), Some(scale), Some(invert)) =
        (finite(&low), finite(&high), finite(&sharpness), finite(&center), finite(&scale), boolean(&invert))
    else {
        return Ok(None);
    };
    let min_spread = match &min_spread {
        None => 0.0,
        Some(x) => match finite(x) {
            Some(x) => x,
            None => return Ok(None),
        },
    };
    let normalize = match normalize.extract::<&str>() {
        Ok("causal") => Normalize::Causal,
        Ok("sequence") => Normalize::Sequence,
        Ok("batch") => Normalize::Batch,
        Ok("none") => Normalize::Fixed { center, scale },
        _ => return Ok(None),
    };
    let params = GateParams { low, high, sharpness, normalize, invert, min_spread };
    by_dtype!(conc, gates_typed(py, &conc, &mask, &cu_seqlens, &params))
}

fn gates_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    conc: &Bound<'py, PyAny>,
    mask: &Option<Bound<'py, PyAny>>,
    cu_seqlens: &Option<Bound<'py, PyAny>>,
    params: &GateParams,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(t) = Tokens::<F>::canonical(conc, mask, cu_seqlens) else { return Ok(None) };
    let x = read(py, "concentration", t.x)?;
    let (m, cu) = t.read_layout(py)?;
    let (xs, ms) = (slice(&x), m.as_ref().map(slice));
    let lay = layout(py, &t.grid, cu.as_ref().map(slice), xs.len())?;
    let out = new_output::<F>(py, &t.grid.shape)?;
    let mut w = write(py, "out", &out)?;
    let o = slice_mut(&mut w);
    let result = with_mask!(ms, |m| py.detach(|| crate::gating::gates_from_concentration(&lay, xs, m, params, o)));
    result.map_err(|e| to_pyerr(py, e))?;
    drop(w);
    Ok(Some(out.into_any()))
}

/// Masked whitening: the whitened array (in `out` when given, in `x` itself when `out`
/// is `x`), or None when an argument is not canonical (`shift_mean` a `bool`, `eps`
/// finite and >= 0, `out` a writeable array apart from `x` and the mask, or `x`).
#[pyfunction]
#[pyo3(signature = (x, mask, cu_seqlens, shift_mean, eps, out))]
fn masked_whiten<'py>(
    py: Python<'py>,
    x: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
    shift_mean: Bound<'py, PyAny>,
    eps: Bound<'py, PyAny>,
    out: Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (Some(shift_mean), Some(eps)) = (boolean(&shift_mean), finite(&eps).filter(|e| *e >= 0.0)) else {
        return Ok(None);
    };
    by_dtype!(x, whiten_typed(py, &x, &mask, &cu_seqlens, shift_mean, eps, &out))
}

fn whiten_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    mask: &Option<Bound<'py, PyAny>>,
    cu_seqlens: &Option<Bound<'py, PyAny>>,
    shift_mean: bool,
    eps: f64,
    out: &Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(t) = Tokens::<F>::canonical(x, mask, cu_seqlens) else { return Ok(None) };
    if out.as_ref().is_some_and(|o| o.is(x)) {
        return whiten_in_place(py, &t, shift_mean, eps);
    }
    let out = match out {
        None => Out::Fresh,
        Some(o) => Out::Given(vec![o.clone()]),
    };
    let mut inputs = t.layout_bytes();
    inputs.push(bytes(t.x));
    if !out.canonical::<F>(&t.grid.shape, &inputs) {
        return Ok(None);
    }
    let xr = read(py, "x", t.x)?;
    let (m, cu) = t.read_layout(py)?;
    let (xs, ms) = (slice(&xr), m.as_ref().map(slice));
    let lay = layout(py, &t.grid, cu.as_ref().map(slice), xs.len())?;
    let out = out.arrays::<F>(py, &t.grid.shape, 1)?.remove(0);
    let mut w = write(py, "out", &out)?;
    let o = slice_mut(&mut w);
    let result = with_mask!(ms, |m| py.detach(|| crate::whiten::masked_whiten(&lay, xs, m, shift_mean, eps, o)));
    result.map_err(|e| to_pyerr(py, e))?;
    drop(w);
    Ok(Some(out.into_any()))
}

/// `masked_whiten(x, out=x)`: overwrites `x` (canonical and writeable, else None).
fn whiten_in_place<'py, F: FloatDtype>(
    py: Python<'py>,
    t: &Tokens<'_, 'py, F>,
    shift_mean: bool,
    eps: f64,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !writeable(t.x) {
        return Ok(None);
    }
    let (m, cu) = t.read_layout(py)?;
    let mut xw = write(py, "x", t.x)?;
    let xs = slice_mut(&mut xw);
    let ms = m.as_ref().map(slice);
    let lay = layout(py, &t.grid, cu.as_ref().map(slice), xs.len())?;
    let result =
        with_mask!(ms, |m| py.detach(|| crate::whiten::masked_whiten_in_place(&lay, &mut *xs, m, shift_mean, eps)));
    result.map_err(|e| to_pyerr(py, e))?;
    drop(xw);
    Ok(Some(t.x.clone().into_any()))
}

/// Credit diagnostics of a per-token array over its valid tokens, as a dict; None when
/// an argument is not canonical.
#[pyfunction]
#[pyo3(signature = (x, mask, cu_seqlens))]
fn credit_stats<'py>(
    py: Python<'py>,
    x: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    by_dtype!(x, stats_typed(py, &x, &mask, &cu_seqlens))
}

fn stats_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    mask: &Option<Bound<'py, PyAny>>,
    cu_seqlens: &Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(t) = Tokens::<F>::canonical(x, mask, cu_seqlens) else { return Ok(None) };
    let xr = read(py, "x", t.x)?;
    let (m, cu) = t.read_layout(py)?;
    let (xs, ms) = (slice(&xr), m.as_ref().map(slice));
    let lay = layout(py, &t.grid, cu.as_ref().map(slice), xs.len())?;
    let s = with_mask!(ms, |m| py.detach(|| crate::stats::credit_stats(&lay, xs, m))).map_err(|e| to_pyerr(py, e))?;
    let d = PyDict::new(py);
    d.set_item("mean", s.mean)?;
    d.set_item("std", s.std)?;
    d.set_item("min", s.min)?;
    d.set_item("max", s.max)?;
    d.set_item("frac_positive", s.frac_positive)?;
    d.set_item("gini", s.gini)?;
    d.set_item("effective_token_ratio", s.effective_token_ratio)?;
    Ok(Some(d))
}

// ---------------------------------------------------------------- outcomes

/// Group-relative outcome advantages (float64), or None when an argument is not
/// canonical (float64 scores and int64 ids of one length, a known `method` and
/// `singleton`, `eps` finite and >= 0).
#[pyfunction]
#[pyo3(signature = (scores, groups, method, eps, singleton))]
fn group_advantages<'py>(
    py: Python<'py>,
    scores: Bound<'py, PyAny>,
    groups: Bound<'py, PyAny>,
    method: Bound<'py, PyAny>,
    eps: Bound<'py, PyAny>,
    singleton: Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    use crate::outcome::{Method, Singleton};
    let method = match method.extract::<&str>() {
        Ok("grpo") => Method::Grpo,
        Ok("drgrpo") => Method::DrGrpo,
        Ok("rloo") => Method::Rloo,
        Ok("reinforce_baseline") => Method::ReinforceBaseline,
        _ => return Ok(None),
    };
    let singleton = match singleton.extract::<&str>() {
        Ok("zero") => Singleton::Zero,
        Ok("raw") => Singleton::Raw,
        _ => return Ok(None),
    };
    let Some(eps) = finite(&eps).filter(|e| *e >= 0.0) else { return Ok(None) };
    let Some(s) = vector::<f64>(&scores) else { return Ok(None) };
    let Some(g) = array::<i64>(&groups, Some(&[s.len()])) else { return Ok(None) };
    let (sr, gr) = (read(py, "scores", s)?, read(py, "groups", g)?);
    let out = new_output::<f64>(py, &[s.len()])?;
    let mut w = write(py, "out", &out)?;
    let (ss, gs, o) = (slice(&sr), slice(&gr), slice_mut(&mut w));
    py.detach(|| crate::outcome::group_advantages(ss, gs, method, eps, singleton, o)).map_err(|e| to_pyerr(py, e))?;
    drop(w);
    Ok(Some(out.into_any()))
}

/// Per-sequence values broadcast to their tokens, or None when an argument is not
/// canonical (a 1-D `per_sequence`; padded: a `[B, T]` bool mask, which gives T;
/// packed: `[B+1]` int64 offsets ending at N >= 0 and an optional `[N]` bool mask).
#[pyfunction]
#[pyo3(signature = (per_sequence, mask, cu_seqlens))]
fn broadcast<'py>(
    py: Python<'py>,
    per_sequence: Bound<'py, PyAny>,
    mask: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    by_dtype!(per_sequence, broadcast_typed(py, &per_sequence, &mask, &cu_seqlens))
}

fn broadcast_typed<'py, F: FloatDtype>(
    py: Python<'py>,
    per_sequence: &Bound<'py, PyAny>,
    mask: &Option<Bound<'py, PyAny>>,
    cu_seqlens: &Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(a) = vector::<F>(per_sequence) else { return Ok(None) };
    let b = a.len();
    let shape = match cu_seqlens {
        None => match mask.as_ref().and_then(|m| array::<bool>(m, None)) {
            Some(m) if m.ndim() == 2 && m.shape()[0] == b => m.shape().to_vec(),
            _ => return Ok(None),
        },
        Some(cu) => match array::<i64>(cu, Some(&[b + 1])) {
            Some(cu) => match usize::try_from(*slice(&read(py, "cu_seqlens", cu)?).last().expect("B+1 offsets")) {
                Ok(n) => vec![n],
                Err(_) => return Ok(None),
            },
            None => return Ok(None),
        },
    };
    let grid = Grid::of(&shape, cu_seqlens).expect("a padded or packed shape");
    let Some(m) = optional::<bool>(mask, &shape) else { return Ok(None) };
    let (ar, mr, cur) = (read(py, "per_sequence", a)?, read_opt(py, "mask", m)?, read_opt(py, "cu_seqlens", grid.cu)?);
    let n = shape.iter().product();
    let lay = layout(py, &grid, cur.as_ref().map(slice), n)?;
    let out = new_output::<F>(py, &shape)?;
    let mut w = write(py, "out", &out)?;
    let (av, ms, o) = (slice(&ar), mr.as_ref().map(slice), slice_mut(&mut w));
    let result = with_mask!(ms, |m| py.detach(|| crate::broadcast::broadcast(&lay, av, m, o)));
    result.map_err(|e| to_pyerr(py, e))?;
    drop(w);
    Ok(Some(out.into_any()))
}

// ---------------------------------------------------------------- process settings

/// Sets the number of threads the kernels use (>= 1).
#[pyfunction]
fn set_num_threads(py: Python<'_>, n: i64) -> PyResult<()> {
    if n < 1 {
        return Err(raise_with(
            py,
            "ParameterError",
            format!("n: expected an integer >= 1, got {n}"),
            ErrorAttrs::arg("n"),
        ));
    }
    pool::set_num_threads(n as usize);
    Ok(())
}

/// The number of threads the kernels use.
#[pyfunction]
fn get_num_threads() -> usize {
    pool::num_threads()
}

/// The code the kernels run in this process: `"avx2"` (the CPU has AVX2 and FMA, and
/// `COMPPO_DISABLE_AVX2` is unset or 0) or `"baseline"` (see `rust/cpu.rs`).
#[pyfunction]
fn simd_path() -> &'static str {
    if crate::cpu::avx2() {
        "avx2"
    } else {
        "baseline"
    }
}

/// `(bytes held for reuse, cap)` of the output buffer cache (see `rust/buffers.rs`).
#[pyfunction]
fn buffer_cache() -> (usize, usize) {
    buffers::stats()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gae, m)?)?;
    m.add_function(wrap_pyfunction!(td_targets, m)?)?;
    m.add_function(wrap_pyfunction!(gates_from_concentration, m)?)?;
    m.add_function(wrap_pyfunction!(group_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(masked_whiten, m)?)?;
    m.add_function(wrap_pyfunction!(credit_stats, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(buffer_cache, m)?)?;
    m.add_function(wrap_pyfunction!(simd_path, m)?)?;
    m.add("NUM_THREADS_ENV", pool::ENV_VAR)?;
    m.add("BUFFER_CACHE_ENV", buffers::ENV_VAR)?;
    // The package version is written once, in Cargo.toml (pyproject.toml's is dynamic).
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
