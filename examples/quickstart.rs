//! Quick start: at most 5 concurrent market API calls per account.
//!
//! Twelve worker threads each want to call the (simulated) market API for account 42;
//! the semaphore lets 5 of them in at a time, wherever they run. Each line shows who
//! held which slot, with which fencing token, and when.
//!
//! Redis: `REDIS_URL` if set, else 127.0.0.1:6379, else a private `redis-server`
//! started from PATH for the length of the run.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::Client;

fn main() {
    let (url, _server) = match find_redis() {
        Ok(found) => found,
        Err(why) => {
            eprintln!("quickstart needs a Redis server: {why}");
            eprintln!(
                "set REDIS_URL=redis://host:port/, run one on 127.0.0.1:6379, or put redis-server on PATH"
            );
            std::process::exit(2);
        }
    };
    println!("using {}", redis_semaphore::redact_url(&url));
    if let Err(e) = run(&url) {
        eprintln!("quickstart failed: {e}");
        std::process::exit(1);
    }
}

fn run(url: &str) -> redis_semaphore::Result<()> {
    let client = Client::open(url)?;
    let sem = client.semaphore("quickstart:market:acct:42", 5)?;
    let start = Instant::now();
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));

    let workers: Vec<_> = (0..12)
        .map(|worker| {
            let sem = sem.clone();
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            thread::spawn(move || -> redis_semaphore::Result<()> {
                let permit = sem.acquire()?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                println!(
                    "{:>6.1} ms  worker {worker:>2} holds slot {:?} (token {}), {now} calling the API",
                    start.elapsed().as_secs_f64() * 1e3,
                    permit.slots(),
                    permit.token(),
                );
                thread::sleep(Duration::from_millis(50)); // the market API call
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release()
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker panicked")?;
    }
    println!(
        "{:>6.1} ms  done: 12 calls, at most {} at once (limit 5), {} permits free",
        start.elapsed().as_secs_f64() * 1e3,
        most.load(Ordering::SeqCst),
        sem.available()?
    );
    Ok(())
}

/// A server that is killed (and its directory removed) when the example ends.
struct PrivateServer {
    child: Child,
    _dir: tempdir::Dir,
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_redis() -> Result<(String, Option<PrivateServer>), String> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Ok((url, None));
    }
    if TcpStream::connect_timeout(&([127, 0, 0, 1], 6379).into(), Duration::from_millis(200))
        .is_ok()
    {
        return Ok(("redis://127.0.0.1:6379/".into(), None));
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let dir = tempdir::Dir::new().map_err(|e| format!("no temp dir: {e}"))?;
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir.0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "no REDIS_URL, nothing on 127.0.0.1:6379, and redis-server could not start: {e}"
            )
        })?;
    let server = PrivateServer { child, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("the private redis-server did not start listening within 5 s".into());
        }
        thread::sleep(Duration::from_millis(10));
    }
    println!("started a private redis-server on port {port}");
    Ok((format!("redis://127.0.0.1:{port}/"), Some(server)))
}

mod tempdir {
    /// A scratch directory for the private server, removed on drop.
    pub struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub fn new() -> std::io::Result<Dir> {
            let path =
                std::env::temp_dir().join(format!("redsem-quickstart-{}", std::process::id()));
            std::fs::create_dir_all(&path)?;
            Ok(Dir(path))
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
