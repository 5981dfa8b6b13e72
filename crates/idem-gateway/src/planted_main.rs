//! `idem-planted`: the `idem` program built with the `planted-bugs` feature, whose
//! `CHAOS_PLANTED_BUG` gives the gateway a deliberate bug (`src/planted.rs`). The fault suite
//! (idem-chaos) runs it to show that its checker catches each bug; nothing else should.

use std::process::ExitCode;

#[path = "main.rs"]
mod idem;

fn main() -> ExitCode {
    idem::main()
}
