//! Prints the tasks an ONNX model imports as: `cargo run -p harl-te --features onnx --example
//! onnx_tasks -- model.onnx`.

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: onnx_tasks MODEL.onnx");
        std::process::exit(2);
    };
    let net = match harl_te::onnx::import(&path) {
        Ok(net) => net,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "{} calls of {} distinct tasks",
        net.total_calls(),
        net.tasks.len()
    );
    for (i, t) in net.tasks.iter().enumerate() {
        let shapes: Vec<_> = t.graph.inputs.iter().map(|p| p.shape.clone()).collect();
        println!(
            "task {i}: x{} {} ({} stages) inputs {shapes:?}",
            t.weight,
            t.name,
            t.graph.stages.len()
        );
    }
}
