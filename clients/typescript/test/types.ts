// Compiled (not run) by run-tests.sh against dist/*.d.ts with strict settings: the API as a
// TypeScript caller sees it.
import {
  IdemClient,
  IdemError,
  KeyReusedError,
  OutcomeUnknownError,
  ProblemError,
  type IdemEvent,
  type IdemResponse,
} from "../dist/index.js";

const events: IdemEvent[] = [];
const client = new IdemClient({
  statusUrl: "http://127.0.0.1:8080/idem/status",
  deadlineMs: 20_000,
  attemptTimeoutMs: 5_000,
  onEvent: (e) => events.push(e),
});

export async function charge(): Promise<number> {
  try {
    const res: IdemResponse = await client.post("http://127.0.0.1:8080/charge", {
      json: { amount: 100 },
      key: "order-42",
    });
    const replayed: boolean = res.replayed;
    const key: string = res.key;
    const body = res.json<{ id: string }>();
    return replayed && key.length > 0 && body.id.length > 0 ? res.status : 0;
  } catch (err) {
    if (err instanceof KeyReusedError || err instanceof OutcomeUnknownError) {
      const status: number = err.status; // a problem always has its status and type
      const type: string = err.type;
      return status + type.length;
    }
    if (err instanceof ProblemError) return err.status;
    if (err instanceof IdemError) {
      const status: number | undefined = err.status; // the client's own errors have none
      return status ?? (err.key === undefined ? -1 : -2);
    }
    throw err;
  }
}

await client.request("PUT", "http://127.0.0.1:8080/orders/1", { body: new Uint8Array([1]) }).catch(() => undefined);
await client.put(new URL("http://127.0.0.1:8080/orders/1"), { body: "x" }).catch(() => undefined);
await client.patch("http://127.0.0.1:8080/orders/1", { json: [1], headers: { "x-api-key": "a" } }).catch(() => undefined);
await client.delete("http://127.0.0.1:8080/orders/1", { signal: AbortSignal.timeout(1) }).catch(() => undefined);
