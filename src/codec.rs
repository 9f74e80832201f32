//! Every encoding Drover keeps or sends carries its data version, so a reader
//! says what it cannot read instead of misreading it.
//!
//! Records in storage, Raft log entries and snapshots are bincode behind a
//! four-byte header: two magic bytes and the data version (u16, little
//! endian) of the build that wrote them. Messages between nodes carry the
//! version once per call, as the `drover-data-version` metadata (see
//! [`crate::transport`]): their bincode payloads are those of that version.
//!
//! [`DATA_VERSION`] is what this build writes; it reads every version from
//! [`OLDEST_VERSION`] on. Version 6 is the last before encodings carried a
//! version: a data directory of that storage format is migrated in place at
//! start (the header is added to every record), and a peer that sends no
//! version speaks 6. When a type's encoding changes, the version goes up, the
//! decoder of the old layout stays here beside the new one, and the new
//! layout is written only once every member of the cluster reads it (the
//! cluster version, see `docs/upgrades.md`).
//!
//! Ground floor: serde and bincode only.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The data version this build writes.
pub const DATA_VERSION: u16 = 20;
/// The oldest data version this build reads: 6, the encodings of storage
/// format 6, which carried no version.
pub const OLDEST_VERSION: u16 = 6;
/// What a versioned encoding starts with, before its version.
const MAGIC: [u8; 2] = [0xD7, 0x5E];
/// The header's length: magic and version.
pub const HEADER_LEN: usize = 4;

/// What a reader could not read.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("corrupt {what}: {source}")]
    Malformed { what: &'static str, source: bincode::Error },
    #[error(
        "{what} carries no data version: it was written before Drover versioned its encodings (storage format 6 \
         or older) and was not migrated; start this build on the whole data directory so that it migrates it"
    )]
    Unversioned { what: &'static str },
    #[error(
        "{what} was written by a newer Drover (data version {version}); this build reads data versions \
         {OLDEST_VERSION} to {DATA_VERSION}: run a build of that version or later"
    )]
    TooNew { what: &'static str, version: u16 },
}

/// The header of an encoding of `version`.
pub fn header(version: u16) -> [u8; HEADER_LEN] {
    let [low, high] = version.to_le_bytes();
    [MAGIC[0], MAGIC[1], low, high]
}

/// `value` in this build's encoding: the header, then bincode.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let size = bincode::serialized_size(value).expect("in-memory values always serialize") as usize;
    let mut out = Vec::with_capacity(HEADER_LEN + size);
    out.extend_from_slice(&header(DATA_VERSION));
    bincode::serialize_into(&mut out, value).expect("in-memory values always serialize");
    out
}

/// `value` as a build of data version `version` writes it: that version's
/// header, then bincode. For what crosses to other nodes at the cluster
/// version (snapshots): a build of that version refuses a newer header. The
/// caller writes no type whose layout `version` lacks.
pub fn encode_as<T: Serialize>(version: u16, value: &T) -> Vec<u8> {
    let size = bincode::serialized_size(value).expect("in-memory values always serialize") as usize;
    let mut out = Vec::with_capacity(HEADER_LEN + size);
    out.extend_from_slice(&header(version));
    bincode::serialize_into(&mut out, value).expect("in-memory values always serialize");
    out
}

/// Writes `value` in this build's encoding to `out`.
pub fn encode_into<T: Serialize>(out: &mut impl std::io::Write, value: &T) -> Result<(), bincode::Error> {
    out.write_all(&header(DATA_VERSION))?;
    bincode::serialize_into(out, value)
}

/// The data version an encoding carries, and its body; an error when it
/// carries none or one this build does not read.
pub fn split<'a>(what: &'static str, bytes: &'a [u8]) -> Result<(u16, &'a [u8]), CodecError> {
    match bytes {
        [m0, m1, low, high, body @ ..] if [*m0, *m1] == MAGIC => {
            let version = u16::from_le_bytes([*low, *high]);
            if version > DATA_VERSION {
                return Err(CodecError::TooNew { what, version });
            }
            Ok((version, body))
        }
        _ => Err(CodecError::Unversioned { what }),
    }
}

/// A value of `bytes`, encoded by this or an older build this build reads.
/// Versions 6 to 12 lay every type they share out alike (later versions only
/// add command variants and records), so the body decodes as is.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let (_, body) = split(what, bytes)?;
    bincode::deserialize(body).map_err(|source| CodecError::Malformed { what, source })
}

/// A value from the front of `bytes` (header and body), advancing past it.
pub fn decode_from<T: DeserializeOwned>(what: &'static str, bytes: &mut &[u8]) -> Result<T, CodecError> {
    let (_, mut body) = split(what, bytes)?;
    let value = bincode::deserialize_from(&mut body).map_err(|source| CodecError::Malformed { what, source })?;
    *bytes = body;
    Ok(value)
}

/// A value from `reader`, reading at most `limit` bytes (what the input
/// holds): a corrupt or hostile length prefix is an error, never an
/// allocation of the size it claims.
pub fn decode_bounded<T: DeserializeOwned>(
    what: &'static str,
    mut reader: impl std::io::Read,
    limit: u64,
) -> Result<T, CodecError> {
    use bincode::Options;
    let mut head = [0u8; HEADER_LEN];
    reader
        .read_exact(&mut head)
        .map_err(|e| CodecError::Malformed { what, source: Box::new(bincode::ErrorKind::Io(e)) })?;
    split(what, &head)?;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(limit.saturating_sub(HEADER_LEN as u64))
        .deserialize_from(reader)
        .map_err(|source| CodecError::Malformed { what, source })
}

/// A value encoded at data version 6, which carried no header: records of
/// a data directory being migrated, payloads of a peer that sends no version.
pub fn decode_unversioned<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    bincode::deserialize(bytes).map_err(|source| CodecError::Malformed { what, source })
}

/// A version-6 record (no header) as this build writes it: the same bytes
/// behind the header, since the layouts did not change.
pub fn versioned_from_6(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&header(DATA_VERSION));
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_round_trips_behind_its_version() {
        let value = ("job", 42u64, vec![1u8, 2, 3]);
        let bytes = encode(&value);
        assert_eq!(&bytes[..HEADER_LEN], &header(DATA_VERSION));
        assert_eq!(decode::<(String, u64, Vec<u8>)>("record", &bytes).unwrap(), ("job".into(), 42, vec![1, 2, 3]));
        let mut rest = &[bytes.clone(), vec![9]].concat()[..];
        assert_eq!(decode_from::<(String, u64, Vec<u8>)>("record", &mut rest).unwrap().1, 42);
        assert_eq!(rest, [9], "decode_from leaves what follows");
        let bounded: (String, u64, Vec<u8>) = decode_bounded("record", &bytes[..], bytes.len() as u64).unwrap();
        assert_eq!(bounded.1, 42);
    }

    #[test]
    fn an_encoding_without_a_version_or_from_a_newer_build_is_refused_by_name() {
        let legacy = bincode::serialize(&7u64).unwrap();
        let error = decode::<u64>("job record", &legacy).unwrap_err();
        assert!(matches!(error, CodecError::Unversioned { .. }), "{error}");
        assert!(error.to_string().contains("job record carries no data version"), "{error}");
        assert_eq!(decode_unversioned::<u64>("job record", &legacy).unwrap(), 7);
        assert_eq!(decode::<u64>("job record", &versioned_from_6(&legacy)).unwrap(), 7);

        let mut newer = encode(&7u64);
        newer[2..4].copy_from_slice(&(DATA_VERSION + 1).to_le_bytes());
        let error = decode::<u64>("raft log", &newer).unwrap_err();
        assert!(matches!(error, CodecError::TooNew { version, .. } if version == DATA_VERSION + 1), "{error}");
        assert!(error.to_string().contains("written by a newer Drover"), "{error}");
    }
}
