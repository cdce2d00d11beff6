export class Client {}
export class Job {}
