/**
 * Wakes everyone waiting for "something happened" to one thing (a job, an app
 * log, a process): `wait()` resolves at the next `notify()`. Shared by the
 * rooms; each keeps its own.
 */
export class Changes {
  #waiters: Array<() => void> = [];

  wait(): Promise<void> {
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  notify(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const resolve of waiters) resolve();
  }
}
