//! The two batch layouts of docs/design.md §2 and how a batch is cut into parallel tasks.
//!
//! * padded: `rows × cols` flat (row-major) arrays; every row has `cols` positions and
//!   validity comes from the mask.
//! * packed: `[N]` flat arrays and `cu_seqlens` `[B+1]`, row `b` occupying
//!   `cu_seqlens[b]..cu_seqlens[b+1]` (flash-attention "varlen", Arrow list offsets).
//!
//! A validated `Layout` guarantees that every row range lies inside `0..len()`; kernels
//! rely on that to index without bounds checks.

use crate::error::{KernelError, Loc, Result};
use std::ops::Range;

#[derive(Debug, Clone, Copy)]
pub enum Layout<'a> {
    Padded { rows: usize, cols: usize },
    Packed { cu_seqlens: &'a [i64] },
}

impl<'a> Layout<'a> {
    /// A padded `[rows, cols]` batch over flat arrays of length `n`.
    pub fn padded(rows: usize, cols: usize, n: usize) -> Result<Self> {
        match rows.checked_mul(cols) {
            Some(total) if total == n => Ok(Layout::Padded { rows, cols }),
            _ => Err(KernelError::Shape {
                arg: "rewards",
                expected: format!("{rows}×{cols} = {} elements", rows.saturating_mul(cols)),
                got: format!("{n}"),
            }),
        }
    }

    /// A packed batch over flat arrays of length `n`: `cu_seqlens` must start at 0,
    /// never decrease and end at `n`.
    pub fn packed(cu_seqlens: &'a [i64], n: usize) -> Result<Self> {
        let Some(&first) = cu_seqlens.first() else {
            return Err(KernelError::CuSeqlens {
                problem: "expected at least one entry ([B+1] offsets), got an empty array".into(),
                index: 0,
            });
        };
        if first != 0 {
            return Err(KernelError::CuSeqlens { problem: format!("expected to start at 0, got {first}"), index: 0 });
        }
        for (k, w) in cu_seqlens.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(KernelError::CuSeqlens {
                    problem: format!("expected non-decreasing offsets, got {} after {}", w[1], w[0]),
                    index: k + 1,
                });
            }
        }
        let last = *cu_seqlens.last().unwrap_or(&0);
        if last != n as i64 {
            return Err(KernelError::CuSeqlens {
                problem: format!("expected to end at N = {n} (the length of the data), got {last}"),
                index: cu_seqlens.len() - 1,
            });
        }
        Ok(Layout::Packed { cu_seqlens })
    }

    /// Number of sequences B.
    pub fn rows(&self) -> usize {
        match *self {
            Layout::Padded { rows, .. } => rows,
            Layout::Packed { cu_seqlens } => cu_seqlens.len() - 1,
        }
    }

    /// Total number of positions N (padded: rows × cols).
    pub fn len(&self) -> usize {
        match *self {
            Layout::Padded { rows, cols } => rows * cols,
            Layout::Packed { cu_seqlens } => *cu_seqlens.last().unwrap_or(&0) as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flat index range of row `b`.
    #[inline]
    pub fn row(&self, b: usize) -> Range<usize> {
        match *self {
            Layout::Padded { cols, .. } => b * cols..(b + 1) * cols,
            Layout::Packed { cu_seqlens } => cu_seqlens[b] as usize..cu_seqlens[b + 1] as usize,
        }
    }

    /// The (row, position) of a flat index, for error messages.
    pub fn locate(&self, flat: usize) -> Loc {
        match *self {
            Layout::Padded { cols, .. } => Loc { row: flat / cols, pos: flat % cols, flat: None },
            Layout::Packed { cu_seqlens } => {
                // the last row whose start is <= flat (skipping empty rows)
                let row = cu_seqlens.partition_point(|&s| s as usize <= flat) - 1;
                Loc { row, pos: flat - cu_seqlens[row] as usize, flat: Some(flat) }
            }
        }
    }

    /// Location of position `pos` of row `row`.
    pub fn loc(&self, row: usize, pos: usize) -> Loc {
        match *self {
            Layout::Padded { .. } => Loc { row, pos, flat: None },
            Layout::Packed { cu_seqlens } => Loc { row, pos, flat: Some(cu_seqlens[row] as usize + pos) },
        }
    }

    /// Cuts the rows into consecutive tasks of roughly `target` positions each (a row is
    /// never split). Results never depend on the cut: each row is computed alone.
    pub fn tasks(&self, target: usize) -> Vec<Task> {
        let target = target.max(1);
        let mut tasks = Vec::new();
        let rows = self.rows();
        let mut b0 = 0;
        while b0 < rows {
            let start = self.row(b0).start;
            let mut b1 = b0 + 1;
            while b1 < rows && self.row(b1).end - start <= target {
                b1 += 1;
            }
            tasks.push(Task { rows: b0..b1, span: start..self.row(b1 - 1).end });
            b0 = b1;
        }
        tasks
    }
}

/// A run of consecutive rows and the flat span they cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub rows: Range<usize>,
    pub span: Range<usize>,
}

/// Splits `out` into the disjoint mutable pieces covered by `tasks` (which are
/// consecutive and cover `0..out.len()` in order).
pub fn split_by_tasks<'o, T>(mut out: &'o mut [T], tasks: &[Task]) -> Vec<&'o mut [T]> {
    let mut pieces = Vec::with_capacity(tasks.len());
    let mut at = 0;
    for task in tasks {
        let (_, rest) = std::mem::take(&mut out).split_at_mut(task.span.start - at);
        let (piece, rest) = rest.split_at_mut(task.span.len());
        pieces.push(piece);
        out = rest;
        at = task.span.end;
    }
    pieces
}

/// How many positions one parallel task should cover: enough to amortise scheduling
/// (about a microsecond per task), few enough that every thread gets many tasks. Rows
/// of a padded batch differ in how much of them is valid, so tasks of equal size take
/// unequal time, and the last one a thread takes decides when the call ends: 32 tasks
/// per thread left the GAE kernel 1–22% faster on W1 and W2 than 8 did (two threads,
/// one process, alternating).
pub fn task_size(n: usize, threads: usize) -> usize {
    (n / (threads.max(1) * 32)).clamp(1 << 14, 1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_validation_names_first_bad_index() {
        assert!(Layout::packed(&[0, 2, 5], 5).is_ok());
        let e = Layout::packed(&[1, 2, 5], 5).unwrap_err();
        assert!(matches!(e, KernelError::CuSeqlens { index: 0, .. }));
        let e = Layout::packed(&[0, 3, 2, 5], 5).unwrap_err();
        assert!(matches!(e, KernelError::CuSeqlens { index: 2, .. }));
        let e = Layout::packed(&[0, 2, 4], 5).unwrap_err();
        assert!(matches!(e, KernelError::CuSeqlens { index: 2, .. }));
        assert!(Layout::packed(&[], 0).is_err());
        assert!(Layout::padded(2, 3, 7).is_err());
    }

    #[test]
    fn locate_skips_empty_rows() {
        let cu = [0i64, 2, 2, 5];
        let l = Layout::packed(&cu, 5).unwrap();
        assert_eq!(l.locate(2), Loc { row: 2, pos: 0, flat: Some(2) });
        assert_eq!(l.locate(1), Loc { row: 0, pos: 1, flat: Some(1) });
        let p = Layout::padded(2, 3, 6).unwrap();
        assert_eq!(p.locate(4), Loc { row: 1, pos: 1, flat: None });
    }

    #[test]
    fn tasks_cover_everything_in_order() {
        let cu = [0i64, 3, 3, 10, 11, 20];
        let l = Layout::packed(&cu, 20).unwrap();
        for target in [1, 4, 8, 100] {
            let t = l.tasks(target);
            assert_eq!(t.first().unwrap().rows.start, 0);
            assert_eq!(t.last().unwrap().rows.end, 5);
            assert_eq!(t.last().unwrap().span.end, 20);
            for w in t.windows(2) {
                assert_eq!(w[0].rows.end, w[1].rows.start);
                assert_eq!(w[0].span.end, w[1].span.start);
            }
            let mut buf = vec![0u8; 20];
            let pieces = split_by_tasks(&mut buf, &t);
            assert_eq!(pieces.iter().map(|p| p.len()).sum::<usize>(), 20);
        }
        assert!(Layout::padded(0, 7, 0).unwrap().tasks(10).is_empty());
    }
}
