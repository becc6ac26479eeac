//! A log the core writes itself, for a process with no logger of its own
//! (`pgbus-hub serve`): "2026-12-04T23:59:01.123Z INFO message" lines, on
//! standard output or appended to a file that `reopen` opens again after
//! logrotate moved it. Records arrive over the hub's log channel and a thread
//! of its own writes them, so no hub thread ever waits on a slow disk.

use crate::log::{Level, Record};
use crate::owned_thread::OwnedThread;
use crate::sync::lock;
use crossbeam_channel::Receiver;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct LogFile {
    /// None: standard output (nothing to reopen).
    path: Option<PathBuf>,
    out: Mutex<Box<dyn Write + Send>>,
}

impl LogFile {
    pub fn open(path: Option<PathBuf>) -> io::Result<Arc<Self>> {
        let out: Box<dyn Write + Send> = match &path {
            Some(path) => Box::new(append(path)?),
            None => Box::new(io::stdout()),
        };
        Ok(Arc::new(Self {
            path,
            out: Mutex::new(out),
        }))
    }

    /// One line, written through (a failed write is lost, never retried).
    /// Debug records are left out, as the plugin's log leaves them out.
    pub fn write(&self, level: Level, message: &str) {
        let label = match level {
            Level::Debug => return,
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        };
        let mut out = lock(&self.out);
        let _ = writeln!(
            out,
            "{} {label} {message}",
            utc_timestamp(SystemTime::now())
        );
        let _ = out.flush();
    }

    /// Opens the file again at its path (logrotate's copy-less rotation) and
    /// says so in the new one; on failure the old one is kept and told why.
    pub fn reopen(&self) {
        let Some(path) = &self.path else { return };
        match append(path) {
            Ok(file) => {
                *lock(&self.out) = Box::new(file);
                self.write(Level::Info, "log reopened");
            }
            Err(e) => self.write(
                Level::Error,
                &format!(
                    "cannot reopen the log {}: {e} — writing on to the old file",
                    path.display()
                ),
            ),
        }
    }

    /// A thread that writes `records` until told to stop, then what is left.
    pub fn spawn_writer(self: &Arc<Self>, records: Receiver<Record>) -> io::Result<OwnedThread> {
        let log = self.clone();
        OwnedThread::spawn_with_stop_channel("pgbus-hub log", move |stop| loop {
            crossbeam_channel::select! {
                recv(records) -> record => match record {
                    Ok(record) => log.write(record.level, &record.message),
                    Err(_) => return,
                },
                recv(stop) -> _ => {
                    records.try_iter().for_each(|record| log.write(record.level, &record.message));
                    return;
                }
            }
        })
    }
}

fn append(path: &PathBuf) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// `time` as ISO 8601 UTC with milliseconds (the civil date from days since
/// the epoch: Howard Hinnant's `civil_from_days`).
fn utc_timestamp(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (days, second) = ((since.as_secs() / 86_400) as i64, since.as_secs() % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        second / 3600,
        second / 60 % 60,
        second % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_utc_civil_dates() {
        let at = |secs: u64, millis: u64| {
            utc_timestamp(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000Z"); // a leap day
        assert_eq!(at(1_780_000_000, 123), "2026-05-28T20:26:40.123Z");
        assert_eq!(at(1_798_761_599, 999), "2026-12-31T23:59:59.999Z");
    }

    #[test]
    fn writes_lines_reopens_after_a_move_and_flushes_what_is_left_at_stop() {
        let dir = std::env::temp_dir().join(format!("pgbus-hub-log-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.log");
        let log = LogFile::open(Some(path.clone())).unwrap();
        let (sink, records) = crate::log::LogSink::channel();
        let writer = log.spawn_writer(records).unwrap();
        sink.info("first");
        sink.debug("left out");
        while !std::fs::read_to_string(&path).unwrap().contains("first") {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::rename(&path, dir.join("serve.log.1")).unwrap();
        log.reopen();
        sink.warn("second");
        let never = crossbeam_channel::never();
        assert_eq!(
            writer.stop_or_cancel(&never, None),
            crate::owned_thread::Stopped::Joined
        );

        let rotated = std::fs::read_to_string(dir.join("serve.log.1")).unwrap();
        assert!(
            rotated.ends_with(" INFO first\n") && rotated.lines().count() == 1,
            "{rotated}"
        );
        let current = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<_> = current
            .lines()
            .map(|l| l.split_once(' ').unwrap().1)
            .collect();
        assert_eq!(lines, ["INFO log reopened", "WARN second"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
