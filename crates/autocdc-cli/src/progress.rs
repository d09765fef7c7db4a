//! A progress indicator for long-running statements.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a statement runs before the indicator appears.
const DELAY: Duration = Duration::from_secs(1);
/// How often the indicator is redrawn.
const TICK: Duration = Duration::from_millis(200);
/// Spinner frames.
const FRAMES: [char; 4] = ['|', '/', '-', '\\'];

/// A spinner with the elapsed time, drawn on stderr while a statement runs longer
/// than [`DELAY`]. Nothing is drawn when stderr is not a terminal.
pub struct Progress {
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Progress {
    /// Starts the indicator for a statement that started at `start`.
    pub fn start(start: Instant) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { running: None };
        }
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(spin(start, stopped));
        Self {
            running: Some((stop, task)),
        }
    }

    /// Stops the indicator and clears it from the screen.
    pub async fn finish(self) {
        if let Some((stop, task)) = self.running {
            // The task may already be gone; there is nothing to stop then.
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

/// Draws the spinner until `stopped` resolves, then clears its line.
async fn spin(start: Instant, mut stopped: oneshot::Receiver<()>) {
    tokio::select! {
        _ = &mut stopped => return,
        () = tokio::time::sleep(DELAY.saturating_sub(start.elapsed())) => {}
    }
    let mut stderr = std::io::stderr();
    let mut ticker = tokio::time::interval(TICK);
    for frame in FRAMES.iter().cycle() {
        tokio::select! {
            _ = &mut stopped => break,
            _ = ticker.tick() => {
                let seconds = start.elapsed().as_secs_f64();
                let _ = write!(stderr, "\r{frame} running... {seconds:.1}s");
                let _ = stderr.flush();
            }
        }
    }
    // Erase the line and return the cursor to its start.
    let _ = write!(stderr, "\r\x1b[2K");
    let _ = stderr.flush();
}
