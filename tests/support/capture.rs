//! A logger that keeps every record logged in the test process (the logger is global
//! to the process: a test binary that installs it has it for all its tests).

use std::sync::{Mutex, Once};

/// Every record logged since [`install`]: level, target and text.
static RECORDS: Mutex<Vec<(log::Level, String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        RECORDS.lock().unwrap().push((
            record.level(),
            record.target().to_owned(),
            record.args().to_string(),
        ));
    }

    fn flush(&self) {}
}

static LOGGER: Capture = Capture;

/// Installs the capture, every level, once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::set_logger(&LOGGER).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// The crate's records so far: level and text.
pub fn crate_records() -> Vec<(log::Level, String)> {
    RECORDS
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, target, _)| target.starts_with("redis_semaphore"))
        .map(|(level, _, text)| (*level, text.clone()))
        .collect()
}

/// The text of every record so far, of any target.
pub fn all_texts() -> Vec<String> {
    RECORDS
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, text)| text.clone())
        .collect()
}
