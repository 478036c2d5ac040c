//! The memory a request's input pictures (the picture to edit, its mask, a control image) will
//! hold once decoded, known from their headers before a pixel is decoded, and checked against
//! a budget summed over all of them: a small file that claims a huge picture is refused by
//! what it claims, not by what decoding it cost.
//!
//! The command line checks a request's inputs against its memory budget. The server shares one
//! [`Pool`] among the requests it holds at once (decoding, queued, running): a request is
//! admitted only when its inputs fit what the others leave, so that many such files sent at
//! once cannot add up past the machine.

use crate::image_in::{self, Header};
use crate::memory_plan::gb;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One input picture, as bytes, with where it came from.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The flag or field (`--image`, `mask`).
    pub what: &'a str,
    /// The file or upload name.
    pub name: &'a str,
    pub bytes: &'a [u8],
}

impl<'a> Input<'a> {
    /// The pictures a request carries, as `(what, name, bytes)`; those it left out (`None`)
    /// are passed over.
    pub fn given(pictures: &[(&'a str, &'a str, Option<&'a [u8]>)]) -> Vec<Input<'a>> {
        (pictures.iter())
            .filter_map(|&(what, name, bytes)| bytes.map(|bytes| Input { what, name, bytes }))
            .collect()
    }
}

/// The inputs' pictures need more memory than the budget.
#[derive(Debug, thiserror::Error)]
#[error(
    "the input pictures need about {} of memory decoded ({}), more than the budget of {}{}; give smaller pictures{}",
    gb(*total), parts.iter().map(|(what, name, bytes)| format!("{what} `{}`: {}", crate::shown::text(name), gb(*bytes))).collect::<Vec<_>>().join(", "),
    gb(*budget), budget_source, advice
)]
pub struct OverBudget {
    /// `(flag or field, name, bytes)` of each input.
    pub parts: Vec<(String, String, u64)>,
    pub total: u64,
    pub budget: u64,
    /// Where the budget came from, for the message (` (--memory-limit 400MB)`).
    pub budget_source: String,
    /// What else the user can do (`, or set a larger --memory-limit`).
    pub advice: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Picture(#[from] image_in::Error),
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    #[error("{0}")]
    Budget(String),
}

/// Every input's header, read without decoding, checked against the picture limits.
pub fn probe_all(inputs: &[Input]) -> Result<Vec<Header>, image_in::Error> {
    inputs
        .iter()
        .map(|i| image_in::probe(i.bytes, i.what, i.name))
        .collect()
}

/// Bytes the inputs hold at most once decoded, each `copies` times (a request for several
/// images carries its inputs with each).
pub fn held_bytes(headers: &[Header], copies: u64) -> u64 {
    headers
        .iter()
        .map(|h| h.held_bytes().saturating_mul(copies.max(1)))
        .fold(0, u64::saturating_add)
}

/// Checks that `inputs`, decoded, fit `budget` bytes; returns the bytes they will hold.
pub fn check(
    inputs: &[Input],
    copies: u64,
    budget: u64,
    budget_source: &str,
    advice: &str,
) -> Result<u64, Error> {
    let headers = probe_all(inputs)?;
    let total = held_bytes(&headers, copies);
    if total > budget {
        return Err(OverBudget {
            parts: inputs
                .iter()
                .zip(&headers)
                .map(|(i, h)| (i.what.to_string(), i.name.to_string(), h.held_bytes()))
                .collect(),
            total,
            budget,
            budget_source: budget_source.to_string(),
            advice: advice.to_string(),
        }
        .into());
    }
    Ok(total)
}

/// The command line's check: the files `(path, flag)` read (each once: the bytes returned, in
/// order, are the ones checked, for the caller to decode) and their headers checked, summed,
/// against the request's memory budget (`--memory-limit`, `ZIMAGE_MEMORY_LIMIT`, or the
/// machine's), before any of them is decoded. Every picture of a request goes through it
/// together, whatever its flag.
pub fn read_files(
    files: &[(&Path, &str)],
    memory_limit: Option<&str>,
) -> Result<Vec<Vec<u8>>, Error> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let (budget, source) = crate::memory_plan::budget(memory_limit).map_err(Error::Budget)?;
    let contents = files
        .iter()
        .map(|(path, what)| image_in::read_file(path, what))
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = files
        .iter()
        .map(|(p, _)| p.to_string_lossy().into_owned())
        .collect();
    let inputs: Vec<Input> = files
        .iter()
        .zip(&contents)
        .zip(&names)
        .map(|(((_, what), bytes), name)| Input { what, name, bytes })
        .collect();
    check(
        &inputs,
        1,
        budget,
        &source,
        ", or a larger budget with --memory-limit or ZIMAGE_MEMORY_LIMIT if the machine really has more free",
    )?;
    Ok(contents)
}

/// Memory shared by the requests a server holds at once, for their input pictures.
#[derive(Debug)]
pub struct Pool {
    capacity: u64,
    used: Mutex<u64>,
}

/// The pool has too little left for a request now; it may fit once others finish.
#[derive(Debug, Clone, Copy)]
pub struct Busy {
    pub wanted: u64,
    pub free: u64,
}

/// Bytes taken from a [`Pool`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    pool: Arc<Pool>,
    bytes: u64,
}

impl Pool {
    /// The share of a server's memory budget its requests' input pictures may hold together:
    /// a quarter (the rest is the model's and the generation's), and at most 1 GiB, which
    /// holds a dozen full-size 8-bit pictures.
    pub fn for_budget(budget: u64) -> Arc<Pool> {
        Pool::new((budget / 4).min(1 << 30))
    }

    pub fn new(capacity: u64) -> Arc<Pool> {
        Arc::new(Pool {
            capacity,
            used: Mutex::new(0),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held by reservations now.
    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `bytes` when that many are free.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, Busy> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let free = self.capacity.saturating_sub(*used);
        if bytes > free {
            return Err(Busy {
                wanted: bytes,
                free,
            });
        }
        *used += bytes;
        Ok(Reservation {
            pool: self.clone(),
            bytes,
        })
    }
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut used = self.pool.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up_and_are_given_back() {
        let pool = Pool::new(100);
        let a = pool.try_reserve(60).unwrap();
        let busy = pool.try_reserve(50).unwrap_err();
        assert_eq!((busy.wanted, busy.free), (50, 40));
        let b = pool.try_reserve(40).unwrap();
        assert_eq!(pool.used(), 100);
        drop(a);
        assert_eq!(pool.used(), 40);
        drop(b);
        assert_eq!(pool.used(), 0);
        assert!(pool.try_reserve(101).is_err());
    }
}
