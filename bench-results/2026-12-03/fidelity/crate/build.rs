fn main() {
    println!("cargo:rerun-if-changed=graphs.json");
    let text = std::fs::read_to_string("graphs.json").expect("graphs.json");
    let graphs: Vec<(String, harl_build::te::Graph)> = serde_json::from_str(&text).expect("graphs");
    let mut b = harl_build::Builder::new();
    for (name, graph) in graphs {
        b = b.kernel(&name, graph);
    }
    b.compile();
}
