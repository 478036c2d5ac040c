//! Checking a manifest: every structural rule that can be checked without reading tensor data.

use super::digest::{Digest, Parsed};
use super::read::{check_values_len, Component, Encoding, Layout, TensorMeta};
use super::{numel, Error, ZDtype, ZtFile, ALIGNMENT, MAGIC};
use ciborium::Value;
use std::collections::BTreeMap;

impl ZtFile {
    pub(super) fn parse_manifest(&mut self, cbor: &[u8], manifest_start: u64) -> Result<(), Error> {
        let path = self.path.clone();
        let bad = |reason: String| Error::Invalid {
            path: path.clone(),
            reason,
        };
        let mut rest = cbor;
        let root: Value = ciborium::de::from_reader(&mut rest).map_err(|e| {
            let why = match e {
                ciborium::de::Error::Io(_) => "it ends early".to_string(),
                ciborium::de::Error::Syntax(at) => format!("syntax error at manifest byte {at}"),
                ciborium::de::Error::Semantic(_, msg) => msg,
                ciborium::de::Error::RecursionLimitExceeded => "it nests too deep".to_string(),
            };
            bad(format!(
                "manifest is not valid CBOR ({why}); the file is damaged or not zTensor v1.0"
            ))
        })?;
        if !rest.is_empty() {
            return Err(bad(format!(
                "{} stray bytes after the CBOR manifest",
                rest.len()
            )));
        }
        let root = entries(root, "manifest").map_err(bad)?;
        let mut tensors = None;
        for (key, value) in root {
            match key.as_str() {
                "version" => self.version = text(value, "manifest field `version`").map_err(bad)?,
                "generator" => {
                    self.generator = text(value, "manifest field `generator`").map_err(bad)?
                }
                "attributes" => {
                    for (k, v) in entries(value, "manifest field `attributes`").map_err(bad)? {
                        let v = text(v, &format!("attribute `{k}`")).map_err(bad)?;
                        self.attributes.insert(k, v);
                    }
                }
                "tensors" => {
                    tensors = Some(entries(value, "manifest field `tensors`").map_err(bad)?)
                }
                // Later minor versions may add keys; crate 1.0.0 ignores them too.
                _ => {}
            }
        }
        self.check_version()?;
        let tensors = tensors.ok_or_else(|| bad("manifest has no `tensors` map".into()))?;
        for (name, value) in tensors {
            let t = self.parse_tensor(&name, value, manifest_start)?;
            self.tensors.insert(name, t);
        }
        Ok(())
    }

    /// §6.1: another major version fails, a newer minor one warns.
    fn check_version(&mut self) -> Result<(), Error> {
        let bad = |reason: String| Error::Invalid {
            path: self.path.clone(),
            reason,
        };
        if self.version.is_empty() {
            return Err(bad("manifest has no `version`".into()));
        }
        let mut parts = self.version.split('.');
        let number = |p: Option<&str>| p.and_then(|s| s.parse::<u64>().ok());
        let (Some(major), minor) = (number(parts.next()), number(parts.next())) else {
            return Err(bad(format!(
                "manifest version `{}` is not MAJOR.MINOR",
                self.version
            )));
        };
        if major != 1 {
            return Err(bad(format!(
                "zTensor version {} is not supported (this reader speaks 1.x); read it with a tool for that version",
                self.version
            )));
        }
        if minor.is_some_and(|m| m > 0) {
            self.warnings.push(format!(
                "file is zTensor {}, newer than 1.0: features it adds are ignored",
                self.version
            ));
        }
        Ok(())
    }

    fn parse_tensor(
        &mut self,
        name: &str,
        value: Value,
        manifest_start: u64,
    ) -> Result<TensorMeta, Error> {
        let path = self.path.clone();
        let bad = |reason: String| Error::Tensor {
            path: path.clone(),
            tensor: name.to_string(),
            reason,
        };
        let (mut dtype, mut shape, mut format, mut comps) = (None, None, None, None);
        for (key, v) in entries(value, "the tensor").map_err(bad)? {
            match key.as_str() {
                "dtype" => dtype = Some(text(v, "field `dtype`").map_err(bad)?),
                "shape" => {
                    let Value::Array(dims) = v else {
                        return Err(bad("field `shape` is not an array".into()));
                    };
                    let dims = dims
                        .into_iter()
                        .map(|d| uint(d, "a `shape` entry"))
                        .collect::<Result<Vec<_>, _>>();
                    shape = Some(dims.map_err(bad)?);
                }
                "format" => format = Some(text(v, "field `format`").map_err(bad)?),
                "components" => comps = Some(entries(v, "field `components`").map_err(bad)?),
                _ => {}
            }
        }
        let missing = |f: &str| bad(format!("has no `{f}`"));
        let dtype_text = dtype.ok_or_else(|| missing("dtype"))?;
        let dtype = ZDtype::parse(&dtype_text).ok_or_else(|| {
            bad(format!("unknown dtype `{dtype_text}` (zTensor v1.0 has float64/32/16, bfloat16, int8–64, uint8–64, bool)"))
        })?;
        let shape = shape.ok_or_else(|| missing("shape"))?;
        let format = format.ok_or_else(|| missing("format"))?;
        let n = numel(&shape).ok_or_else(|| {
            bad(format!(
                "shape {shape:?} has more elements than fit in 64 bits"
            ))
        })?;
        let dense_len = n.checked_mul(dtype.size()).ok_or_else(|| {
            bad(format!(
                "shape {shape:?} of {} overflows 64 bits of bytes",
                dtype.name()
            ))
        })?;

        let mut components = BTreeMap::new();
        for (role, v) in comps.ok_or_else(|| missing("components"))? {
            let c = self.parse_component(name, &role, v, manifest_start)?;
            components.insert(role, c);
        }
        let layout = match format.as_str() {
            "dense" => Layout::Dense {
                data: take(&mut components, "data").map_err(bad)?,
            },
            "sparse_csr" => Layout::Csr {
                values: take(&mut components, "values").map_err(bad)?,
                indices: take(&mut components, "indices").map_err(bad)?,
                indptr: take(&mut components, "indptr").map_err(bad)?,
            },
            "sparse_coo" => Layout::Coo {
                values: take(&mut components, "values").map_err(bad)?,
                coords: take(&mut components, "coords").map_err(bad)?,
            },
            _ => {
                self.warnings.push(format!(
                    "tensor `{name}` has format `{format}`, which zimage lists but cannot decode"
                ));
                Layout::Other {
                    format: format.clone(),
                    components: std::mem::take(&mut components),
                }
            }
        };
        if let Some(role) = components.keys().next() {
            return Err(bad(format!("format `{format}` has no component `{role}`")));
        }
        let t = TensorMeta {
            name: name.to_string(),
            dtype,
            shape,
            numel: n,
            dense_len,
            layout,
        };
        self.check_sizes(&t)?;
        Ok(t)
    }

    fn parse_component(
        &mut self,
        tensor: &str,
        role: &str,
        value: Value,
        manifest_start: u64,
    ) -> Result<Component, Error> {
        let path = self.path.clone();
        let bad = |reason: String| Error::Component {
            path: path.clone(),
            tensor: tensor.to_string(),
            component: role.to_string(),
            reason,
        };
        let (mut offset, mut length, mut encoding, mut digest) = (None, None, Encoding::Raw, None);
        for (key, v) in entries(value, "the component").map_err(bad)? {
            match key.as_str() {
                "offset" => offset = Some(uint(v, "field `offset`").map_err(bad)?),
                "length" => length = Some(uint(v, "field `length`").map_err(bad)?),
                "encoding" if v.is_null() => {}
                "encoding" => {
                    encoding = match text(v, "field `encoding`").map_err(bad)?.as_str() {
                        "raw" => Encoding::Raw,
                        "zstd" => Encoding::Zstd,
                        other => {
                            return Err(bad(format!(
                                "unknown encoding `{other}` (expected `raw` or `zstd`)"
                            )))
                        }
                    }
                }
                "digest" if v.is_null() => {}
                "digest" => {
                    let t = text(v, "field `digest`").map_err(bad)?;
                    match Digest::parse(&t).map_err(bad)? {
                        Parsed::Known(d) => digest = Some(d),
                        Parsed::Unknown(algo) => self.warnings.push(format!(
                            "tensor `{tensor}`, component `{role}`: digest algorithm `{algo}` is unknown; read unverified"
                        )),
                    }
                }
                _ => {}
            }
        }
        let offset = offset.ok_or_else(|| bad("has no `offset`".into()))?;
        let length = length.ok_or_else(|| bad("has no `length`".into()))?;
        if offset % ALIGNMENT != 0 {
            return Err(bad(format!("offset {offset} is not a multiple of {ALIGNMENT}; the file is damaged or not zTensor v1.0")));
        }
        if offset < MAGIC.len() as u64 {
            return Err(bad(format!("offset {offset} lies inside the magic number")));
        }
        match offset.checked_add(length) {
            Some(end) if end <= manifest_start => {}
            _ => {
                return Err(bad(format!(
                    "bytes {offset}..{} run past the data area, which ends at {manifest_start} where the manifest starts (truncated or damaged file)",
                    offset as u128 + length as u128
                )))
            }
        }
        Ok(Component {
            offset,
            length,
            encoding,
            digest,
        })
    }

    /// Sizes that can be checked without decoding: raw components have their exact size.
    fn check_sizes(&self, t: &TensorMeta) -> Result<(), Error> {
        let bad = |role: &str, reason: String| Error::Component {
            path: self.path.clone(),
            tensor: t.name.clone(),
            component: role.to_string(),
            reason,
        };
        let raw = |c: &Component| (c.encoding == Encoding::Raw).then_some(c.length);
        match &t.layout {
            Layout::Dense { data } => {
                if let Some(len) = raw(data) {
                    if len != t.dense_len {
                        return Err(bad(
                            "data",
                            format!(
                                "holds {len} bytes, but shape {:?} of {} needs {}",
                                t.shape,
                                t.dtype.name(),
                                t.dense_len
                            ),
                        ));
                    }
                }
            }
            Layout::Csr {
                values,
                indices,
                indptr,
            } => {
                if t.shape.len() != 2 {
                    return Err(Error::Tensor {
                        path: self.path.clone(),
                        tensor: t.name.clone(),
                        reason: format!("sparse_csr needs a 2-D shape, got {:?}", t.shape),
                    });
                }
                let want = t.shape[0].checked_add(1).and_then(|r| r.checked_mul(8));
                if let (Some(len), Some(want)) = (raw(indptr), want) {
                    if len != want {
                        return Err(bad(
                            "indptr",
                            format!("holds {len} bytes, but {} rows need {want}", t.shape[0]),
                        ));
                    }
                }
                self.check_nnz(t, values, &[("indices", indices, 1)])?;
            }
            Layout::Coo { values, coords } => {
                self.check_nnz(t, values, &[("coords", coords, t.shape.len() as u64)])?;
            }
            Layout::Other { .. } => {}
        }
        Ok(())
    }

    /// For raw sparse components: whole elements, at most `numel` values, and index arrays of
    /// `per_value` u64s per value.
    fn check_nnz(
        &self,
        t: &TensorMeta,
        values: &Component,
        index: &[(&str, &Component, u64)],
    ) -> Result<(), Error> {
        let bad = |role: &str, reason: String| Error::Component {
            path: self.path.clone(),
            tensor: t.name.clone(),
            component: role.to_string(),
            reason,
        };
        let nnz = (values.encoding == Encoding::Raw).then(|| values.length / t.dtype.size());
        if values.encoding == Encoding::Raw {
            check_values_len(t, values.length).map_err(|r| bad("values", r))?;
        }
        for (role, c, per_value) in index {
            if c.encoding != Encoding::Raw {
                continue;
            }
            if c.length % 8 != 0 {
                return Err(bad(
                    role,
                    format!(
                        "holds {} bytes, not a whole number of u64 indices",
                        c.length
                    ),
                ));
            }
            if let Some(nnz) = nnz {
                if nnz.checked_mul(*per_value).and_then(|n| n.checked_mul(8)) != Some(c.length) {
                    return Err(bad(
                        role,
                        format!(
                            "holds {} bytes, but {nnz} values need {} u64 indices each",
                            c.length, per_value
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Components of different tensors must not share bytes (empty ones take none).
    pub(super) fn check_overlap(&self) -> Result<(), Error> {
        let mut ranges: Vec<(u64, u64, &str, &str)> =
            self.tensors
                .values()
                .flat_map(|t| {
                    t.layout.components().into_iter().map(move |(role, c)| {
                        (c.offset, c.offset + c.length, t.name.as_str(), role)
                    })
                })
                .filter(|r| r.1 > r.0)
                .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(Error::Component {
                    path: self.path.clone(),
                    tensor: w[1].2.to_string(),
                    component: w[1].3.to_string(),
                    reason: format!(
                        "bytes {}..{} overlap tensor `{}` component `{}` ({}..{}); the file is damaged",
                        w[1].0, w[1].1, w[0].2, w[0].3, w[0].0, w[0].1
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A CBOR map with text keys, each key once.
fn entries(v: Value, what: &str) -> Result<Vec<(String, Value)>, String> {
    let Value::Map(pairs) = v else {
        return Err(format!("{what} is not a CBOR map"));
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let Value::Text(k) = k else {
            return Err(format!("{what} has a key that is not text"));
        };
        if !seen.insert(k.clone()) {
            return Err(format!("{what} has the key `{k}` twice"));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn text(v: Value, what: &str) -> Result<String, String> {
    match v {
        Value::Text(s) => Ok(s),
        _ => Err(format!("{what} is not a text string")),
    }
}

fn uint(v: Value, what: &str) -> Result<u64, String> {
    match v {
        Value::Integer(i) => {
            u64::try_from(i).map_err(|_| format!("{what} is not an unsigned 64-bit integer"))
        }
        _ => Err(format!("{what} is not an unsigned integer")),
    }
}

fn take(components: &mut BTreeMap<String, Component>, role: &str) -> Result<Component, String> {
    components
        .remove(role)
        .ok_or_else(|| format!("has no `{role}` component"))
}
