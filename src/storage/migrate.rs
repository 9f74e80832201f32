//! Migrations of the records in place, from one storage format to the next.
//!
//! Format 6 to 7: every record written through [`super::encode`] gets the
//! data-version header ([`crate::codec`]); the layouts did not change, so the
//! bytes after it are the record as it was. Tables are rewritten in key
//! order, a batch at a time; each batch also records how far the migration
//! got, so a migration cut short by a crash resumes after the last batch that
//! reached the disk, and never rewrites a record twice. The data directory
//! says it is migrating until the last batch is synced (see
//! `node::data_dir`), so an older build refuses it meanwhile rather than
//! misreading half-migrated records.

use rocksdb::{Direction, IteratorMode};

use super::{StorageError, Store, Table};

/// The tables whose values are encoded records (the expiry index holds bare
/// numbers).
const ENCODED: [Table; 6] = [Table::Log, Table::Meta, Table::Jobs, Table::Done, Table::Requests, Table::Specs];
/// Where the migration records its progress: a key of no partition
/// (partitions are below 4096) in the meta table.
const PROGRESS: &[u8] = b"\xff\xff\xff\xffmigration";
/// Records rewritten per batch, at most.
const BATCH_RECORDS: usize = 4096;
/// Bytes rewritten per batch, about.
const BATCH_BYTES: usize = 16 << 20;

/// What a finished migration did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    pub records: u64,
    pub bytes: u64,
    /// Whether it went on from an earlier, interrupted start.
    pub resumed: bool,
}

impl Store {
    /// Rewrites every record of format 6 as format 7 writes it, resuming
    /// where an interrupted run stopped; syncs before it returns.
    pub fn migrate_from_6(&self) -> Result<Migrated, StorageError> {
        self.migrate(usize::MAX)
    }

    /// [`Store::migrate_from_6`], stopping (as a crash would) after
    /// `max_batches` batches if it has not finished by then.
    fn migrate(&self, max_batches: usize) -> Result<Migrated, StorageError> {
        let progress = self.db.get_cf(self.cf(Table::Meta), PROGRESS)?;
        let (mut table, mut after) = match &progress {
            Some(bytes) => decode_progress(bytes)?,
            None => (0, None),
        };
        let mut done = Migrated { resumed: progress.is_some(), ..Migrated::default() };
        let mut batches = 0;
        while table < ENCODED.len() {
            if batches == max_batches {
                return Ok(done);
            }
            match self.migrate_batch(table, after.as_deref(), &mut done)? {
                Some(last) => {
                    after = Some(last);
                    batches += 1;
                }
                None => {
                    table += 1;
                    after = None;
                }
            }
        }
        let mut batch = self.batch();
        batch.delete(Table::Meta, PROGRESS);
        self.write_synced(batch);
        self.flush_memtables();
        Ok(done)
    }

    /// Rewrites the next batch of `ENCODED[table]` after key `after`: the
    /// last key it rewrote, or `None` when the table is done.
    fn migrate_batch(
        &self,
        table: usize,
        after: Option<&[u8]>,
        done: &mut Migrated,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let cf = self.cf(ENCODED[table]);
        let mode = match after {
            Some(key) => IteratorMode::From(key, Direction::Forward),
            None => IteratorMode::Start,
        };
        let mut batch = self.batch();
        let (mut records, mut bytes, mut last) = (0usize, 0usize, None);
        for item in self.db.iterator_cf(cf, mode) {
            let (key, value) = item?;
            if after == Some(&key[..]) || &key[..] == PROGRESS {
                continue;
            }
            batch.put(ENCODED[table], &key, crate::codec::versioned_from_6(&value));
            records += 1;
            bytes += key.len() + value.len();
            last = Some(key.into_vec());
            if records >= BATCH_RECORDS || bytes >= BATCH_BYTES {
                break;
            }
        }
        let Some(last) = last else { return Ok(None) };
        batch.put(Table::Meta, PROGRESS, encode_progress(table, &last));
        self.write(batch);
        done.records += records as u64;
        done.bytes += bytes as u64;
        Ok(Some(last))
    }
}

/// The progress record: the table's position in [`ENCODED`], then the last
/// key rewritten. Bare bytes: the migration reads it before any record is
/// versioned.
fn encode_progress(table: usize, last: &[u8]) -> Vec<u8> {
    let mut out = vec![table as u8];
    out.extend_from_slice(last);
    out
}

fn decode_progress(bytes: &[u8]) -> Result<(usize, Option<Vec<u8>>), StorageError> {
    match bytes.split_first() {
        Some((table, last)) if (*table as usize) < ENCODED.len() => Ok((*table as usize, Some(last.to_vec()))),
        _ => Err(StorageError::Io(std::io::Error::other(format!(
            "the migration's progress record is damaged ({} bytes): restore the data directory from a backup or \
             re-seed this node",
            bytes.len()
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{key, meta_key};

    /// A store holding records as format 6 wrote them: bare bincode.
    fn format_6(store: &Store, records: u64) {
        let mut batch = store.batch();
        for id in 0..records {
            batch.put(Table::Jobs, key(0, id), bincode::serialize(&(id, "job")).unwrap());
            batch.put(Table::Specs, key(0, id), bincode::serialize(&format!("spec {id}")).unwrap());
            batch.put(Table::Expiry, key(0, id), id.to_be_bytes());
        }
        batch.put(Table::Meta, meta_key(0, "vote"), bincode::serialize(&7u64).unwrap());
        store.write_synced(batch);
    }

    fn check(store: &Store, records: u64) {
        for id in 0..records {
            let job: (u64, String) =
                crate::storage::decode("job", &store.get(Table::Jobs, key(0, id)).unwrap().unwrap())
                    .unwrap_or_else(|e| panic!("job {id}: {e}"));
            assert_eq!(job, (id, "job".to_string()));
            let spec: String = crate::storage::decode("spec", &store.get(Table::Specs, key(0, id)).unwrap().unwrap())
                .unwrap_or_else(|e| panic!("spec {id}: {e}"));
            assert_eq!(spec, format!("spec {id}"));
            assert_eq!(store.get(Table::Expiry, key(0, id)).unwrap().unwrap(), id.to_be_bytes(), "untouched");
        }
        let vote: u64 =
            crate::storage::decode("vote", &store.get(Table::Meta, meta_key(0, "vote")).unwrap().unwrap()).unwrap();
        assert_eq!(vote, 7);
        assert!(store.get(Table::Meta, PROGRESS).unwrap().is_none(), "the progress record is gone");
    }

    #[test]
    fn every_record_gets_its_version_once_even_when_the_migration_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let records = (BATCH_RECORDS * 2 + 10) as u64;
        format_6(&store, records);
        // A first run cut short after two batches (the vote, then the
        // first jobs), as a crash would leave it.
        let partial = store.migrate(2).unwrap();
        assert_eq!(partial.records, 1 + BATCH_RECORDS as u64);
        assert!(store.get(Table::Meta, PROGRESS).unwrap().is_some(), "it says how far it got");

        let resumed = store.migrate_from_6().unwrap();
        assert!(resumed.resumed);
        assert_eq!(
            resumed.records + partial.records,
            2 * records + 1,
            "every job, spec and the vote rewritten exactly once"
        );
        check(&store, records);
        drop(store);
        let reopened = Store::open(dir.path()).unwrap();
        check(&reopened, records);
    }
}
