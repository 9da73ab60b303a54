fn main() {
    eprintln!("toeplitz_scaling: not written yet");
}
