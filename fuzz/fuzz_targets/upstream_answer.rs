//! `call::upstream::h1::Conn::read_answer`, the plain-HTTP tool client's answer reader, on arbitrary bytes
//! from the tool: the first two bytes pick the cap on the body, the third the size of the pipe
//! (so reads come in pieces), the rest is what the tool sends before it closes. Never panics or
//! hangs; a status has at most three digits; a body that was read is within the cap; a
//! connection is kept only after a body read to its end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncWriteExt;
use toolgate::call::upstream::h1::Conn;

fuzz_target!(|data: &[u8]| {
    let [a, b, pipe, sent @ ..] = data else {
        return;
    };
    let limit = u64::from(u16::from_le_bytes([*a, *b]));
    let pipe = usize::from(*pipe).max(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let (ours, mut theirs) = tokio::io::duplex(pipe);
        let sent = sent.to_vec();
        let tool = tokio::spawn(async move {
            // The reader may stop early (an error, the cap): then the writes fail, which is fine.
            for piece in sent.chunks(pipe) {
                if theirs.write_all(piece).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        let mut conn = Conn::new(ours);
        let read = conn.read_answer(limit).await;
        if let Ok((answer, keep)) = &read {
            assert!(answer.status <= 999, "status {}", answer.status);
            if let Ok(body) = &answer.body {
                assert!(body.len() as u64 <= limit, "{} over {limit}", body.len());
            }
            if *keep {
                assert!(answer.body.is_ok(), "kept after a failed body");
            }
        }
        drop(conn);
        tool.await.expect("the tool's writes");
    });
});
