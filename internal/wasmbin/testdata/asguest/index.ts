// asguest is a small AssemblyScript module (built by ../gen.sh) to test the
// rewrite on AssemblyScript compiler output: its runtime allocates and
// collects garbage in loops of its own.

// fib returns the n-th Fibonacci number with a loop.
export function fib(n: i32): i64 {
  let a: i64 = 0, b: i64 = 1;
  for (let i = 0; i < n; i++) {
    const t = a + b;
    a = b;
    b = t;
  }
  return a;
}

// churn builds and sorts arrays and strings, so the runtime allocates,
// frees and collects.
export function churn(n: i32): i32 {
  let total = 0;
  for (let round = 0; round < n; round++) {
    const xs = new Array<i32>();
    for (let i = 0; i < 100; i++) xs.push((i * 7919 + round) % 1000);
    xs.sort((a, b) => a - b);
    const s = xs.slice(0, 10).join(",");
    total = (total * 31 + xs[50] + s.length) | 0;
  }
  return total;
}

// spin never returns.
export function spin(): void {
  let i = 0;
  while (true) i++;
}
