/**
 * Express controller for the /orders resource.
 *
 * Handlers validate the request, call the order repository and the payment gateway, and shape
 * JSON responses. Pricing rules live in ./pricing; persistence in ./orderRepository.
 */

import { Router, Request, Response, NextFunction } from "express";
import { EventEmitter } from "events";
import { v4 as uuid } from "uuid";

import { requireAuth, requireRole, AuthedRequest } from "../middleware/auth";
import { OrderRepository, OrderRow, OrderStatus } from "../repositories/orderRepository";
import { InventoryClient } from "../clients/inventoryClient";
import { PaymentGateway, ChargeResult } from "../clients/paymentGateway";
import { computeTotals, Totals, LineItemInput } from "../pricing";
import { logger } from "../logger";

const DEFAULT_LIMIT = 20;
const MAX_LIMIT = 100;
const CANCELLABLE: OrderStatus[] = ["pending", "paid"];
const CURRENCIES = ["USD", "EUR", "GBP"] as const;

export type Currency = (typeof CURRENCIES)[number];

export interface OrderView {
  id: string;
  customerId: string;
  status: OrderStatus;
  currency: Currency;
  items: { sku: string; quantity: number; unitPrice: number }[];
  totals: Totals;
  createdAt: string;
  updatedAt: string;
  trackingNumber?: string;
}

export const orderEvents = new EventEmitter();

const repo = new OrderRepository();
const inventory = new InventoryClient(process.env.INVENTORY_URL ?? "http://inventory:8080");
const payments = new PaymentGateway(process.env.PAYMENT_API_KEY ?? "");

function toView(row: OrderRow): OrderView {
  return {
    id: row.id,
    customerId: row.customer_id,
    status: row.status,
    currency: row.currency as Currency,
    items: row.items.map((item) => ({
      sku: item.sku,
      quantity: item.quantity,
      unitPrice: item.unit_price,
    })),
    totals: {
      subtotal: row.subtotal,
      tax: row.tax,
      shipping: row.shipping,
      discount: row.discount,
      total: row.total,
    },
    createdAt: row.created_at.toISOString(),
    updatedAt: row.updated_at.toISOString(),
    trackingNumber: row.tracking_number ?? undefined,
  };
}

function sendError(res: Response, status: number, message: string, details?: Record<string, unknown>) {
  res.status(status).json({ error: { status, message, ...(details ?? {}) } });
}

function parseLimit(raw: unknown): number {
  const n = Number(raw ?? DEFAULT_LIMIT);
  if (!Number.isFinite(n) || n < 1) {
    return DEFAULT_LIMIT;
  }
  return Math.min(Math.floor(n), MAX_LIMIT);
}

function canAccess(req: AuthedRequest, order: OrderRow): boolean {
  return req.user.role === "admin" || req.user.id === order.customer_id;
}

export const router = Router();

/**
 * GET /orders?status=&cursor=&limit=
 * Lists the caller's orders (admins see everyone's), newest first, cursor-paginated.
 */
router.get("/", requireAuth, async (req: AuthedRequest, res: Response, next: NextFunction) => {
  try {
    const limit = parseLimit(req.query.limit);
    const status = req.query.status as OrderStatus | undefined;
    const cursor = typeof req.query.cursor === "string" ? req.query.cursor : undefined;
    const customerId = req.user.role === "admin" ? undefined : req.user.id;
    const rows = await repo.list({ customerId, status, cursor, limit: limit + 1 });
    const hasMore = rows.length > limit;
    const page = rows.slice(0, limit);
    res.json({
      items: page.map(toView),
      nextCursor: hasMore ? page[page.length - 1].id : null,
    });
  } catch (err) {
    next(err);
  }
});

/**
 * GET /orders/:id
 */
router.get("/:id", requireAuth, async (req: AuthedRequest, res: Response, next: NextFunction) => {
  try {
    const order = await repo.findById(req.params.id);
    if (!order || !canAccess(req, order)) {
      return sendError(res, 404, "order not found", { id: req.params.id });
    }
    res.json(toView(order));
  } catch (err) {
    next(err);
  }
});

/**
 * POST /orders
 * Body: { currency, items: [{ sku, quantity }], couponCode?, shippingAddress }
 * Reserves stock, prices the order and stores it as "pending".
 */
router.post("/", requireAuth, async (req: AuthedRequest, res: Response, next: NextFunction) => {
  const body = req.body ?? {};
  const currency: Currency = body.currency ?? "USD";
  const items: LineItemInput[] = body.items ?? [];
  try {
    const prices = await inventory.getPrices(items.map((i) => i.sku), currency);
    const missing = items.filter((i) => !(i.sku in prices));
    if (missing.length > 0) {
      return sendError(res, 422, "unknown SKUs", { skus: missing.map((i) => i.sku) });
    }
    const reservation = await inventory.reserve(items, { ttlSeconds: 900 });
    if (!reservation.ok) {
      return sendError(res, 409, "insufficient stock", { skus: reservation.unavailable });
    }
    const totals = computeTotals(items, prices, {
      couponCode: body.couponCode,
      country: body.shippingAddress?.country,
    });
    const order = await repo.insert({
      id: uuid(),
      customer_id: req.user.id,
      status: "pending",
      currency,
      items: items.map((i) => ({ sku: i.sku, quantity: i.quantity, unit_price: prices[i.sku] })),
      reservation_id: reservation.id,
      shipping_address: body.shippingAddress,
      ...totalsToColumns(totals),
    });
    orderEvents.emit("order.created", order);
    res.status(201).json(toView(order));
  } catch (err) {
    next(err);
  }
});

function totalsToColumns(totals: Totals) {
  return {
    subtotal: totals.subtotal,
    tax: totals.tax,
    shipping: totals.shipping,
    discount: totals.discount,
    total: totals.total,
  };
}

/**
 * POST /orders/:id/pay
 * Charges the customer's saved payment method. Idempotent through the Idempotency-Key header.
 */
router.post("/:id/pay", requireAuth, (req: AuthedRequest, res: Response, next: NextFunction) => {
  const idempotencyKey = req.header("Idempotency-Key") ?? uuid();
  repo.findByIdCallback(req.params.id, (err: Error | null, order?: OrderRow) => {
    if (err) {
      return next(err);
    }
    if (!order || !canAccess(req, order)) {
      return sendError(res, 404, "order not found", { id: req.params.id });
    }
    if (order.status !== "pending") {
      return sendError(res, 409, `order is ${order.status}, not pending`);
    }
    payments.charge(
      {
        customerId: order.customer_id,
        amount: order.total,
        currency: order.currency,
        reference: order.id,
        idempotencyKey,
      },
      (chargeErr: Error | null, result?: ChargeResult) => {
        if (chargeErr) {
          logger.warn({ orderId: order.id, err: chargeErr }, "charge failed");
          return sendError(res, 502, "payment gateway error");
        }
        if (!result || result.status !== "succeeded") {
          return sendError(res, 402, "payment declined", { reason: result?.declineReason });
        }
        repo.updateStatusCallback(order.id, "paid", { payment_id: result.id }, (updateErr: Error | null, updated?: OrderRow) => {
          if (updateErr) {
            return next(updateErr);
          }
          orderEvents.emit("order.paid", updated);
          res.json(toView(updated as OrderRow));
        });
      },
    );
  });
});

/**
 * POST /orders/:id/cancel
 * Cancels a pending or paid order, refunding and releasing stock as needed.
 */
router.post("/:id/cancel", requireAuth, async (req: AuthedRequest, res: Response, next: NextFunction) => {
  try {
    const order = await repo.findById(req.params.id);
    if (!order || !canAccess(req, order)) {
      return sendError(res, 404, "order not found", { id: req.params.id });
    }
    if (!CANCELLABLE.includes(order.status)) {
      return sendError(res, 409, `an order that is ${order.status} cannot be cancelled`);
    }
    if (order.status === "paid" && order.payment_id) {
      const refund = await payments.refund(order.payment_id, order.total);
      if (refund.status !== "succeeded") {
        return sendError(res, 502, "refund failed, order not cancelled");
      }
    }
    if (order.reservation_id) {
      await inventory.release(order.reservation_id);
    }
    const updated = await repo.updateStatus(order.id, "cancelled", {
      cancelled_reason: req.body?.reason ?? null,
    });
    orderEvents.emit("order.cancelled", updated);
    res.json(toView(updated));
  } catch (err) {
    next(err);
  }
});

/**
 * POST /orders/:id/ship   (warehouse staff)
 * Body: { carrier, trackingNumber }
 */
router.post(
  "/:id/ship",
  requireAuth,
  requireRole("warehouse"),
  async (req: AuthedRequest, res: Response, next: NextFunction) => {
    try {
      const order = await repo.findById(req.params.id);
      if (!order) {
        return sendError(res, 404, "order not found", { id: req.params.id });
      }
      if (order.status !== "paid") {
        return sendError(res, 409, "only paid orders can be shipped");
      }
      const { carrier, trackingNumber } = req.body ?? {};
      await inventory.commit(order.reservation_id);
      const updated = await repo.updateStatus(order.id, "shipped", {
        carrier,
        tracking_number: trackingNumber,
        shipped_at: new Date(),
      });
      orderEvents.emit("order.shipped", updated);
      res.json(toView(updated));
    } catch (err) {
      next(err);
    }
  },
);

/**
 * GET /orders/:id/invoice
 * Renders a plain-text invoice; admins and the order's customer only.
 */
router.get("/:id/invoice", requireAuth, async (req: AuthedRequest, res: Response, next: NextFunction) => {
  try {
    const order = await repo.findById(req.params.id);
    if (!order || !canAccess(req, order)) {
      return sendError(res, 404, "order not found", { id: req.params.id });
    }
    const lines = [
      `Invoice for order ${order.id}`,
      `Date: ${order.created_at.toISOString().slice(0, 10)}`,
      "",
      ...order.items.map(
        (item) => `${item.sku.padEnd(16)} ${String(item.quantity).padStart(4)} x ${formatMoney(item.unit_price, order.currency)}`,
      ),
      "",
      `Subtotal: ${formatMoney(order.subtotal, order.currency)}`,
      `Tax:      ${formatMoney(order.tax, order.currency)}`,
      `Shipping: ${formatMoney(order.shipping, order.currency)}`,
      `Discount: ${formatMoney(-order.discount, order.currency)}`,
      `Total:    ${formatMoney(order.total, order.currency)}`,
    ];
    res.type("text/plain").send(lines.join("\n"));
  } catch (err) {
    next(err);
  }
});

function formatMoney(cents: number, currency: string): string {
  const symbol = currency === "EUR" ? "€" : currency === "GBP" ? "£" : "$";
  const sign = cents < 0 ? "-" : "";
  return `${sign}${symbol}${(Math.abs(cents) / 100).toFixed(2)}`;
}

/**
 * GET /orders/stats/daily?days=   (admins)
 * Revenue and order counts per day for a dashboard chart.
 */
router.get(
  "/stats/daily",
  requireAuth,
  requireRole("admin"),
  async (req: AuthedRequest, res: Response, next: NextFunction) => {
    try {
      const days = Math.min(Math.max(Number(req.query.days ?? 30), 1), 365);
      const since = new Date(Date.now() - days * 24 * 3600 * 1000);
      const rows = await repo.dailyTotals(since);
      res.json({
        days,
        series: rows.map((r) => ({ day: r.day, orders: r.count, revenue: r.revenue })),
      });
    } catch (err) {
      next(err);
    }
  },
);

/**
 * Re-sends order confirmation e-mails for orders created in a time window; used by support
 * after a mail outage. Reports progress through the callback as each order is handled.
 */
export function resendConfirmations(
  from: Date,
  to: Date,
  onProgress: (done: number, total: number) => void,
  onDone: (err: Error | null, sent?: number) => void,
): void {
  repo.listCreatedBetweenCallback(from, to, (err: Error | null, rows?: OrderRow[]) => {
    if (err || !rows) {
      return onDone(err ?? new Error("no rows"));
    }
    let sent = 0;
    let index = 0;
    const sendNext = () => {
      if (index >= rows.length) {
        return onDone(null, sent);
      }
      const order = rows[index++];
      orderEvents.emit("order.confirmation_requested", order, (mailErr: Error | null) => {
        if (!mailErr) {
          sent += 1;
        } else {
          logger.warn({ orderId: order.id, err: mailErr }, "confirmation resend failed");
        }
        onProgress(index, rows.length);
        sendNext();
      });
    };
    sendNext();
  });
}

/**
 * Error handler for this router: known errors become JSON, the rest are logged as 500s.
 */
router.use((err: Error & { status?: number }, req: Request, res: Response, _next: NextFunction) => {
  const status = err.status ?? 500;
  if (status >= 500) {
    logger.error({ err, path: req.path }, "unhandled error in orders controller");
  }
  sendError(res, status, status >= 500 ? "internal error" : err.message);
});

export default router;
