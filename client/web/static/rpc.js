// The dsh web client's one import (docs/WEB.md "The JavaScript client"): the connection
// (connection.js: RpcConnection, RpcError, b64encode, b64decode) and the views on top of it
// (views.js: LaneView, OutputFollower, readAll). Modules are split by layer so that none
// passes 500 lines and none imports a module that imports it back:
//   codec.js <- lane.js <- views.js -> connection.js;  rpc.js re-exports the last two.
export {
  RpcConnection, RpcError, b64encode, b64decode, CONNECTION_LOST, NOT_CONNECTED, BACKOFF_FIRST_MS,
  BACKOFF_MAX_MS, MAX_PENDING, MAX_QUEUED, MAX_MESSAGE_BYTES,
} from "./connection.js";
export { LaneView, OutputFollower, readAll } from "./views.js";
